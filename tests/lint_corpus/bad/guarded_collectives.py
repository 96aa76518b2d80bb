# Collectives that only rank 0 reaches: a barrier, a broadcast after an early return on the
# other ranks, a CheckpointManager.save (a barrier) and an FSDP state_dict (an all-gather).
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from gpu_training.checkpoint import CheckpointManager


def save_if_best(rank, model, best):
    if rank == 0:
        torch.save(model.module.state_dict(), "best.pt")
        dist.barrier()  # expect: GT009


def share(ctx, value):
    if not ctx.is_main_process:
        return None
    t = torch.tensor([value])
    dist.broadcast(t, src=0)  # expect: GT009
    return t


def checkpoint(ctx, state, step):
    with CheckpointManager("ckpt", ctx=ctx) as ckpt:
        if ctx.is_main_process:
            ckpt.save(state, step=step)  # expect: GT009


def export(model):
    sharded = FSDP(model)
    if dist.get_rank() == 0:
        full = sharded.state_dict()  # expect: GT009
        torch.save(full, "full.pt")


def download_first(args):
    # Half of the "rank 0 goes first" idiom: rank 0 never reaches a matching barrier.
    if args.local_rank not in [-1, 0]:
        dist.barrier()  # expect: GT009
    return torch.hub.load_state_dict_from_url(args.url)
