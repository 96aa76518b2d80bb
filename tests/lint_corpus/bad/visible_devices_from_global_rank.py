# The process narrows CUDA_VISIBLE_DEVICES to one GPU chosen by its *global* rank (MPI's world
# rank, or torchrun's RANK): on a second node the index runs past the node's GPU list.
import os

import torch.distributed as dist
from mpi4py import MPI


def setup_from_mpi():
    rank = int(MPI.COMM_WORLD.Get_rank())
    devices = [int(x) for x in os.environ["CUDA_VISIBLE_DEVICES"].split(",")]
    os.environ["CUDA_VISIBLE_DEVICES"] = str(devices[rank])  # expect: GT018
    dist.init_process_group("nccl", rank=rank, world_size=MPI.COMM_WORLD.Get_size())


def setup_from_env():
    os.environ["CUDA_VISIBLE_DEVICES"] = f"{os.environ['RANK']}"  # expect: GT018
    dist.init_process_group("nccl")


if __name__ == "__main__":
    if "RANK" in os.environ:  # torchrun
        setup_from_env()
    else:  # mpirun
        setup_from_mpi()
    dist.destroy_process_group()
