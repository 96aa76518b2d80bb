# The global rank chosen by a conditional expression whose other side is the one-process
# default (0): on the distributed path it is still the global rank, and a GPU index made
# from it names a GPU a second node does not have.
import os

import torch
import torch.distributed as dist


def channel_stats(loader, channels: int, rank: int) -> torch.Tensor:
    total = torch.zeros(channels, device=f"cuda:{rank}")  # expect: GT018
    for batch, _ in loader:
        total += batch.to(f"cuda:{rank}").sum(dim=(0, 2, 3))  # expect: GT018
    dist.all_reduce(total)
    return total


def build(loader, channels: int) -> torch.Tensor:
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    return channel_stats(loader, channels, rank)


def place(model: torch.nn.Module) -> torch.nn.Module:
    gpu = 0 if "RANK" not in os.environ else int(os.environ["RANK"])
    torch.cuda.set_device(gpu)  # expect: GT018
    return model.cuda()


dist.init_process_group("nccl")
