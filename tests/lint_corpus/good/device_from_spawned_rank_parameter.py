# A parameter named rank proves nothing by itself: mp.spawn passes the process index on this
# node, and a caller that passes LOCAL_RANK gives a local index.
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    model = DDP(torch.nn.Linear(2, 2).to(rank), device_ids=[rank])
    model(torch.zeros(1, 2, device=rank)).sum().backward()
    dist.destroy_process_group()


def place(module, index):
    return module.to(index)


def called_then_spawned(rank):
    torch.cuda.set_device(rank)


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
    place(torch.nn.Linear(2, 2), int(os.environ["LOCAL_RANK"]))
    place(torch.nn.Linear(2, 2), int(os.environ.get("LOCAL_RANK", 0)))
    called_then_spawned(int(os.environ["RANK"]))
    mp.spawn(called_then_spawned, nprocs=2)
