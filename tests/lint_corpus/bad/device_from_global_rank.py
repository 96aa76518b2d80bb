# The GPU index taken from the global rank: right on one node, cuda:4 on the second node of
# 4-GPU machines.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def get_rank():
    if not dist.is_initialized():
        return 0
    return dist.get_rank()


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)  # expect: GT018
    model = build_model().to(get_rank())  # expect: GT018
    model = DDP(model, device_ids=[dist.get_rank()])  # expect: GT018
    local_rank = int(os.environ["LOCAL_RANK"])
    model.to(local_rank)
    model.to(rank % torch.cuda.device_count())
    loss = model(torch.randn(2, 2, device=f"cuda:{local_rank}")).sum()
    loss.backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
