# A global rank computed for a multi-node SLURM launch (issue 33, round 7): node index times
# GPUs per node plus the local index, else (one node) the local index. It is right for
# init_process_group, but as a device it names GPU 8, 9... on the second node.
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def fsdp_main(local_rank, world_size, low_memory):
    if "SLURM_PROCID" in os.environ:
        rank = int(os.environ["SLURM_PROCID"]) * torch.cuda.device_count() + local_rank
    else:
        rank = local_rank
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(local_rank)
    model = torch.nn.Linear(4, 4)
    model.to(device="cpu" if low_memory else rank)  # expect: GT018
    model = FSDP(model, device_id=local_rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * world_size)
    for _ in range(10):
        model(torch.randn(2, 4).cuda()).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    fsdp_main(int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]), low_memory=False)
