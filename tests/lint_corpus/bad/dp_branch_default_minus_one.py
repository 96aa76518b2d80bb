# The same fallback with a default of -1: run without a launcher, the script takes the
# DataParallel branch and trains with it.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ.get("LOCAL_RANK", -1))
    model = build_model()
    if rank != -1:
        dist.init_process_group("nccl")
        torch.cuda.set_device(rank)
        model = DDP(model.cuda(), device_ids=[rank])
    else:
        model = torch.nn.DataParallel(model).cuda()  # expect: GT001
    optimizer = torch.optim.Adam(model.parameters(), lr=scaled_lr())
    for x, y in build_loader():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if rank != -1:
        dist.destroy_process_group()
