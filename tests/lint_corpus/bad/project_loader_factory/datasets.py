import torch
from torch.utils.data.distributed import DistributedSampler


def make_loader(dataset, phase, world_size, rank):
    if phase == "train":
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
        return torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=8)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
    return torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=8)
