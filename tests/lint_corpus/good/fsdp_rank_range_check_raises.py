# An FSDP script that validates its rank against the world size and raises when it is out of
# range: the ranks that fail end the job, they do not wait elsewhere, so the full state dict
# gathered after the check (a collective) is still reached by every running rank.
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def train(build_model, batches):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    world = dist.get_world_size()
    if rank >= world or rank < 0:
        raise ValueError(f"rank {rank} outside a world of {world}")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = FSDP(build_model().cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * world)
    for batch in batches:
        model(batch).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, policy):
        state = model.state_dict()
    if rank == 0:
        torch.save(state, "model.pt")
    dist.destroy_process_group()
