# Rank guards written every which way: all of these are rank-0 only.
import os

import torch
import torch.distributed as dist

from gpu_training.ddp import cleanup_distributed, init_distributed

ctx = init_distributed()
rank = dist.get_rank() if dist.is_initialized() else 0
is_zero = rank == 0
if not dist.is_initialized() or dist.get_rank() == 0:
    print("starting")
if int(os.environ.get("RANK", "0")) == 0:
    torch.save({"step": 0}, "start.pt")
if is_zero:
    print("zero")
if rank != 0:
    pass
else:
    print("also zero")
if 0 == ctx.rank and ctx.world_size > 1:
    print("zero of many")
if ctx.rank in (0,):
    print("tuple zero")


def report(metrics):
    if dist.get_rank() > 0:
        return
    print(metrics)
    with open("metrics.txt", "a") as handle:
        handle.write(str(metrics))


report({"loss": 1.0})
cleanup_distributed()
