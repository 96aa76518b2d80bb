# The entry: init through the helper (another module), samplers chosen in if/else, the
# checkpoint through save_on_master, the log file under the predicate.
import json
import os

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

import utils
from engine import train_one_epoch


def main(args):
    utils.init_distributed_mode(args)
    print(args)
    dataset = build_dataset(args)
    if args.distributed:
        sampler = DistributedSampler(dataset, shuffle=True)
    else:
        sampler = RandomSampler(dataset)
    loader = DataLoader(dataset, sampler=sampler, batch_size=args.batch_size)
    model = build_model().cuda()
    model_without_ddp = model
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
        model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        if args.distributed:
            loader.sampler.set_epoch(epoch)
        train_one_epoch(model, torch.nn.CrossEntropyLoss(), loader, optimizer, epoch)
        utils.save_on_master({"model": model_without_ddp.state_dict()}, "checkpoint.pth")
        if utils.is_main_process():
            with open(os.path.join(args.output_dir, "log.txt"), "a") as f:
                f.write(json.dumps({"epoch": epoch}) + "\n")
    utils.cleanup()


if __name__ == "__main__":
    main(parse_args())
