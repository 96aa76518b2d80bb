# The DataParallel fallback sits on the `rank == -1` side, but rank is read with
# int(os.environ["LOCAL_RANK"]), which raises without a launcher: every run takes DDP.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")
    torch.cuda.set_device(rank)
    model = build_model()
    if rank != -1:
        model = DDP(model.cuda(), device_ids=[rank])
    else:
        model = torch.nn.DataParallel(model).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=base_lr() * dist.get_world_size())
    for x, y in build_loader():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
