# The entry point: pins the process to its LOCAL_RANK, then shards the model with shard.py.
import os

import torch
import torch.distributed as dist
from shard import place_experts, place_stages, split_linear_layers


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = torch.nn.Module()
    split_linear_layers(model, dist.get_world_size())
    place_stages([torch.nn.Linear(2, 2) for _ in range(dist.get_world_size())])
    place_experts([torch.nn.Linear(2, 2) for _ in range(8)], dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
