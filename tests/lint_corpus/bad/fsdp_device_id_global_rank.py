# FSDP's device_id is the GPU the module is moved to and sharded on (issue 33, round 12): given
# the global rank, it names GPU 8, 9, ... on the second node of a multi-node run, where only
# GPUs 0..7 exist. The local rank is the index.
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy


def main(rank, world_size, net):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    model = FSDP(
        net,
        device_id=rank,  # expect: GT018
        sharding_strategy=ShardingStrategy.HYBRID_SHARD,
        sync_module_states=True,
    )
    return model


def build(net):
    dist.init_process_group(backend="nccl")
    global_rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return torch.distributed.fsdp.FullyShardedDataParallel(net, device_id=global_rank)  # expect: GT018


class Runner:
    def __init__(self, net):
        dist.init_process_group("nccl")
        self.rank = dist.get_rank()
        self.model = FSDP(net, device_id=self.rank, use_orig_params=True)  # expect: GT018


if __name__ == "__main__":
    if os.environ.get("STYLE") == "builder":
        build(torch.nn.Linear(4, 4))
    elif os.environ.get("STYLE") == "class":
        Runner(torch.nn.Linear(4, 4))
    else:
        main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), torch.nn.Linear(4, 4))
