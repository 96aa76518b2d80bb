import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ckpt_utils import save_model


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    for _ in range(10):
        loss = model(torch.randn(8, 4).cuda()).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if dist.get_rank() == 0:
        save_model(model.module, "ckpt")
    if local_rank == 0:
        print("node done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
