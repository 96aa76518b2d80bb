# The entry: the group comes from util.misc and is never destroyed.
import torch
from torch.utils.data import DataLoader, DistributedSampler

import util.misc as misc
from engine import train_one_epoch


def main(args):
    misc.init_distributed_mode(args)  # expect: GT015
    dataset = build_dataset(args)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, sampler=sampler, batch_size=args.batch_size)
    model = torch.nn.parallel.DistributedDataParallel(build_model().cuda(), device_ids=[args.gpu])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_scaler = misc.NativeScalerWithGradNormCount()
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        train_one_epoch(model, loader, optimizer, loss_scaler, args)


if __name__ == "__main__":
    main(parse_args())
