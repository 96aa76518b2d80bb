# The global rank reaches set_device through a helper that returns (distributed, rank, world):
# cuda:<global rank> is right on one node only. The local index from the same kind of helper
# is fine.
import os

import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler


def setup():
    if "RANK" in os.environ:
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        return True, rank, dist.get_world_size()
    return False, 0, 1


def setup_local():
    dist.init_process_group("nccl")
    return int(os.environ["LOCAL_RANK"]), dist.get_world_size()


def main():
    distributed, rank, world = setup()
    if distributed:
        torch.cuda.set_device(rank)  # expect: GT018
    local, _ = setup_local()
    model = torch.nn.Linear(2, 2).to(local)
    sampler = DistributedSampler(range(8), num_replicas=world, rank=rank)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        model(torch.randn(2, 2)).sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
