# The epoch loop hands the loader to the script's own train_one_epoch (not the toolkit's,
# which calls set_epoch) and nobody calls sampler.set_epoch (issue 33).
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def train_one_epoch(model, loader, opt):
    for x in loader:
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


def main(model, ds, opt, local_rank):
    dist.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    for epoch in range(3):  # expect: GT005
        train_one_epoch(model, loader, opt)
    dist.destroy_process_group()
