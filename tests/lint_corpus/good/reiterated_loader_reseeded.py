# Endless batch generators that advance the sampler's epoch on every pass, or whose sampler
# does not shuffle: each pass draws a new order (or the order is meant to stay).
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def infinite(loader, sampler):
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        for batch in loader:
            yield batch
        epoch += 1


def forever(loader):
    while True:
        for batch in loader:
            yield batch


def main(dataset):
    dist.init_process_group("nccl")
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    batches = infinite(loader, sampler)
    ordered = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, shuffle=False))
    evals = forever(ordered)
    return batches, evals
