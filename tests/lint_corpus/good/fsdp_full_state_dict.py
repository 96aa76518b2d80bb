# FSDP: the full state dict is gathered on every rank (a collective), then only rank 0 writes;
# a broadcast of a rank-0 decision reaches every rank in both branches.
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def export(model, path):
    model = FSDP(model)
    policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, policy):
        state = model.state_dict()
    if dist.get_rank() == 0:
        torch.save(state, path)
    dist.barrier()


def decide(flag):
    decision = torch.zeros(1)
    if dist.get_rank() == 0:
        decision.fill_(float(flag))
        dist.broadcast(decision, src=0)
    else:
        dist.broadcast(decision, src=0)
    return bool(decision.item())
