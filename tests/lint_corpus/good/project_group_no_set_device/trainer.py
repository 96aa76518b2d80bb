# The trainer module of bad/project_group_no_set_device/ with a set-up function that pins
# the device before it creates the group (issue 33); train.py calls it before it picks
# "cuda", which is then each process's own GPU.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def setup_distributed(local_rank):
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")


class Trainer:
    def __init__(self, model, local_rank):
        self.model = DistributedDataParallel(model, device_ids=[local_rank])

    def train(self, loader, optimizer):
        for x, y in loader:
            optimizer.zero_grad()
            self.model(x).sub(y).pow(2).mean().backward()
            optimizer.step()
        dist.destroy_process_group()
