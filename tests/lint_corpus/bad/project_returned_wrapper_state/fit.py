# The training function returns the DDP wrapper's state_dict() for its caller to save
# (run.py): the checkpoint's keys all start with "module.".
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def fit(epochs):
    local_rank = int(os.environ["LOCAL_RANK"])
    model = DistributedDataParallel(torch.nn.Linear(2, 2).cuda(), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    for _ in range(epochs):
        model(torch.randn(4, 2).cuda()).sum().backward()
        opt.step()
    return {"model": model.state_dict(), "epochs": epochs}, 0.0  # expect: GT006
