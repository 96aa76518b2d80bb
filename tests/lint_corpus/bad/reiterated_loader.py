# A shuffling DistributedSampler's loader handed to an endless batch generator (issue 33,
# round 12): every pass of the generator's outer loop is an epoch, and set_epoch ran once
# before (or never), so every pass draws the same order.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def infinite(loader):
    while True:
        for batch in loader:
            yield batch


def cycle_passes(data, passes):
    for _ in range(passes):
        for item in data:
            yield item


def main(dataset, steps):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    sampler = DistributedSampler(dataset, shuffle=True, drop_last=True)
    sampler.set_epoch(0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    batches = infinite(loader)  # expect: GT005
    for _ in range(steps):
        loss = model(next(batches).cuda()).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


def other(dataset):
    dist.init_process_group("nccl")
    train_loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset))
    stream = cycle_passes(train_loader, 10)  # expect: GT005
    return stream
