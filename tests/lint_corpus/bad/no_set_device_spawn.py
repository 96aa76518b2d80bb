# mp.spawn style: the device string is the default GPU, the rank is never used to pick one.
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group(backend="nccl", rank=rank, world_size=world)
    device = torch.device("cuda")  # expect: GT002
    t = torch.ones(3, device=device)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
