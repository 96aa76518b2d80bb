# DDP told to use GPU 0 in a script every rank runs: each rank's replica is pointed at the
# first card whatever device the rank pinned (or left its model on).
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
net = torch.nn.Linear(8, 8).to(torch.cuda.current_device())
net = DistributedDataParallel(net, device_ids=[0], output_device=0)  # expect: GT002


def wrap(module: torch.nn.Module) -> torch.nn.Module:
    """A helper of the same script: a tuple of ids, the output device alone."""
    replica = DistributedDataParallel(module, device_ids=(1,))  # expect: GT002
    return DistributedDataParallel(replica.module, output_device=0)  # expect: GT002


for _ in range(2):
    net(torch.randn(4, 8, device="cuda")).sum().backward()
dist.destroy_process_group()
