import os

import torch
import torch.distributed as dist
from engine import Engine
from torch.nn.parallel import DistributedDataParallel


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    model = DistributedDataParallel(torch.nn.Linear(2, 2).cuda(), device_ids=[local_rank])
    engine = Engine(model, "checkpoints", rank=local_rank)
    for epoch in range(3):
        engine.save(epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
