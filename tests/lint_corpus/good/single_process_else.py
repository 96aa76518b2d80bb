# The sampler is built only when there is more than one process; the `else:` is the
# single-process run, where a shuffled plain DataLoader is right (issue 33).
import os

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def make_loader(ds, batch_size):
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    sampler = None
    if world_size > 1:
        sampler = DistributedSampler(ds, shuffle=True)
        loader = DataLoader(ds, batch_size=batch_size, sampler=sampler)
    else:
        loader = DataLoader(ds, batch_size=batch_size, shuffle=True)
    return loader, sampler


def main(ds):
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl")
    loader, sampler = make_loader(ds, 16)
    for epoch in range(3):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for _ in loader:
            pass
    if dist.is_initialized():
        dist.destroy_process_group()
