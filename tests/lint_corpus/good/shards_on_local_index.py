# Tensor-parallel shards placed by index, correctly: the index is compared with the node-local
# rank, or the shard picked by the global rank goes to the process's own GPU (LOCAL_RANK).
import os

import torch
import torch.distributed as dist


def shard_by_local_index(weights, tp_size):
    local_rank = int(os.environ["LOCAL_RANK"])
    for i, piece in enumerate(torch.chunk(weights, tp_size)):
        if i == local_rank:
            return piece.to(f"cuda:{i}")
    return None


def shard_by_global_index(weights, tp_size):
    gpu = int(os.environ["LOCAL_RANK"])
    for i, piece in enumerate(torch.chunk(weights, tp_size)):
        if dist.get_rank() == i:
            return piece.to(f"cuda:{gpu}")
        if dist.get_rank() != i:
            piece.to("meta")
    return None


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    shard_by_local_index(torch.randn(8, 8), dist.get_world_size())
    shard_by_global_index(torch.randn(8, 8), dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
