# Who saves is decided once, in a True/False flag switched by a rank test (issue 33, round 10):
# `if save_models:` later is a rank guard. Spawned workers: the group is made in the worker.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank, args):
    save_models = True
    if args.distributed:
        dist.init_process_group("nccl", rank=rank, world_size=args.world_size)
        torch.cuda.set_device(rank)
        if dist.get_rank() != args.main_gpu:  # every rank but the main one
            save_models = False
    model = DDP(torch.nn.Linear(8, 8).cuda(), device_ids=[rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for x in args.batches:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    if save_models:
        torch.save(model.module.state_dict(), "model.pt")
    if args.distributed:
        dist.destroy_process_group()


def deepspeed_worker(args, engine, loader):
    import deepspeed

    deepspeed.init_distributed()
    writes_report = False
    if dist.get_rank() == 0:
        writes_report = True
    for batch in loader:
        engine.backward(engine(batch))
        engine.step()
    if writes_report:
        with open("report.txt", "w") as f:
            f.write("done")


def main(args):
    mp.spawn(worker, args=(args,), nprocs=args.world_size)
