# The node-local rank (or the one-process default) as the GPU index, whichever form the
# conditional takes: the right index on every node.
import os

import torch
import torch.distributed as dist


def place(model: torch.nn.Module, distributed: bool) -> torch.nn.Module:
    local = int(os.environ["LOCAL_RANK"]) if distributed else 0
    torch.cuda.set_device(local)
    rank = dist.get_rank() if distributed else 0
    if rank == 0:
        print("placed")
    return model.to(f"cuda:{local}")


dist.init_process_group("nccl")
