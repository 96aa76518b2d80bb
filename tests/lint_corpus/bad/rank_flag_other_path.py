# A save flag switched off on the non-main ranks of one launch path only (issue 33, round 10):
# on the torchrun path the group is made by the caller, the flag stays True on every rank.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def train(rank=None, args=None):
    save_models = True
    if args.spawn:
        dist.init_process_group("nccl", rank=rank, world_size=args.world_size)
        torch.cuda.set_device(rank)
        if dist.get_rank() != 0:
            save_models = False
    model = DDP(torch.nn.Linear(8, 8).cuda())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for x in args.batches:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    if save_models:
        torch.save(model.module.state_dict(), "model.pt")  # expect: GT007
    dist.destroy_process_group()


def main(args):
    if args.spawn:
        mp.spawn(train, args=(args,), nprocs=args.world_size)
    elif args.torchrun:
        dist.init_process_group("nccl")
        torch.cuda.set_device(args.local_rank)
        train(args=args)
