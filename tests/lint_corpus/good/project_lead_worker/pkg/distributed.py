# A rank-0 predicate built from two of the project's own tests (issue 33): `rank == 0`, or
# `rank == -1` (a serial run, one process) through another function.
import torch.distributed as dist


def is_running_serially(rank):
    return rank == -1


def is_lead_worker(rank: int) -> bool:
    lead: bool = rank == 0 or is_running_serially(rank)
    return lead


def setup(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
