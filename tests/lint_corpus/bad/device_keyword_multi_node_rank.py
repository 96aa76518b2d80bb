# A spawned worker computes its global rank from the node index on a SLURM cluster (the
# local index alone on one machine) and moves the model with .to(device=rank): the GPU
# index is the global rank on the second node. set_device uses the local index, rightly.
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(local_rank, world_size, low_memory):
    if "SLURM_PROCID" in os.environ:
        rank = int(os.environ["SLURM_PROCID"]) * torch.cuda.device_count() + local_rank
    else:
        rank = local_rank
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(local_rank)
    model = torch.nn.Linear(2, 2)
    model.to(dtype=torch.float32, device="cpu" if low_memory else rank)  # expect: GT018
    model(torch.randn(2, 2)).sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    gpus = torch.cuda.device_count()
    mp.spawn(worker, args=(int(os.environ.get("WORLD_SIZE", gpus)), False), nprocs=gpus)
