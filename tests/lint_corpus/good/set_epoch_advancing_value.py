# set_epoch's argument changes every pass even when it is not the loop's own variable: an
# attribute the loop advances, an attribute of self (a method may advance it), an expression
# of the epoch, or the parameter of a per-epoch function.
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def one_epoch(epoch, sampler, loader, model):
    for x in loader:
        sampler.set_epoch(epoch)
        model(x).sum().backward()


def train(cfg, state, model, data):
    dist.init_process_group("nccl")
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, sampler=sampler)
    for _ in range(cfg.epochs):
        sampler.set_epoch(state.epoch)
        for x in loader:
            model(x).sum().backward()
        state.epoch += 1
    for epoch in range(cfg.epochs):
        sampler.set_epoch(cfg.seed + epoch)
        one_epoch(epoch, sampler, loader, model)
    dist.destroy_process_group()
