# The global rank read from the environment in the entry point reaches the device index as a
# parameter of the functions it is passed to: cuda:<global rank> exists on the first node only.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler


def init(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)  # expect: GT018


def fit(cfg, rank, world_size):
    init(rank, world_size)
    net = torch.nn.Linear(2, 2).to(rank)  # expect: GT018
    net = DDP(net, device_ids=[rank])  # expect: GT018
    sampler = DistributedSampler(range(8), num_replicas=world_size, rank=rank)
    for epoch in range(cfg):
        sampler.set_epoch(epoch)
    dist.destroy_process_group()


def run_eval(model, *, gpu):
    return model.cuda(gpu)  # expect: GT018


if __name__ == "__main__":
    global_rank = int(os.environ["RANK"])
    fit(3, global_rank, int(os.environ["WORLD_SIZE"]))
    run_eval(torch.nn.Linear(2, 2), gpu=dist.get_rank())
