# A script that picks its strategy by the hardware it finds: "single", "fsdp" or "hybrid".
# setup() returns before init_process_group for "single", so that value runs one process.
# The save's sharded branches write on rank 0 only; its final `else:` is the "single" branch
# (the only value the if/elif chain leaves), where one process writes alone.
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy


def pick_strategy():
    n = torch.cuda.device_count()
    if n == 1:
        return "single"
    return "hybrid" if int(os.environ.get("NNODES", "1")) > 1 else "fsdp"


def setup(strategy):
    if strategy == "single":
        return 0
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return local_rank


def is_main(strategy):
    return strategy == "single" or dist.get_rank() == 0


def save(model, strategy, path):
    if strategy == "fsdp":
        state = model.state_dict()
        if is_main(strategy):
            torch.save(state, path)
    elif strategy == "hybrid":
        state = model.state_dict()
        if is_main(strategy):
            torch.save(state, path.replace(".pt", ".hybrid.pt"))
    else:
        torch.save(model.state_dict(), path)


def main():
    strategy = pick_strategy()
    local_rank = setup(strategy)
    model = build_model().cuda(local_rank)
    if strategy == "fsdp":
        model = FSDP(model, device_id=local_rank)
    elif strategy == "hybrid":
        model = FSDP(model, device_id=local_rank, sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    train(model)
    save(model, strategy, "final.pt")
    if strategy != "single":
        dist.destroy_process_group()
