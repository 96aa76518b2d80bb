# set_epoch gets the same value on every pass of the epoch loop (the epoch count, a literal):
# the sampler reshuffles with one seed, the same order every epoch.
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def train(args, model, data):
    dist.init_process_group("nccl")
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(args.epochs)  # expect: GT005
        for x in loader:
            model(x).sum().backward()
    for _ in range(3):
        loader.sampler.set_epoch(0)  # expect: GT005
        for x in loader:
            model(x).sum().backward()
    for ep in range(args.epochs):
        sampler.set_epoch(ep)
        for x in loader:
            model(x).sum().backward()
    dist.destroy_process_group()
