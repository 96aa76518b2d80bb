# Rank-0 code as libraries and helpers spell it (issue 33): Lightning's @rank_zero_only on a
# function, predicates named is_rank_0 / is_rank0 / on_rank_zero from an installed package,
# and detectron2's get_local_rank(), the rank within the node's process group (not the
# global rank) used as the GPU index. None of these is a finding.
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_only

_LOCAL_PROCESS_GROUP = None


def get_local_rank():
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank(group=_LOCAL_PROCESS_GROUP)


@rank_zero_only
def dump(model):
    torch.save(model.state_dict(), "dump.pt")


def main(model, helpers):
    dist.init_process_group("nccl")
    torch.cuda.set_device(get_local_rank())
    if helpers.is_rank_0():
        torch.save(model.state_dict(), "a.pt")
    if helpers.is_rank0():
        torch.save(model.state_dict(), "b.pt")
    if helpers.on_rank_zero():
        torch.save(model.state_dict(), "c.pt")
    dump(model)
    dist.destroy_process_group()
