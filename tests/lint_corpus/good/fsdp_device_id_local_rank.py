# FSDP's device_id from the local rank, or the current device after set_device: the GPU of this
# node the process owns, right on any number of nodes.
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def main(net):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = FSDP(net, device_id=local_rank)
    other = FSDP(torch.nn.Linear(2, 2), device_id=torch.cuda.current_device())
    return model, other
