# CUDA_VISIBLE_DEVICES narrowed by the node-local rank (MPI's shared-memory communicator,
# torchrun's LOCAL_RANK): each process of a node sees its own GPU.
import os

import torch.distributed as dist
from mpi4py import MPI


def setup():
    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "0,1,2,3").split(",")
    os.environ["CUDA_VISIBLE_DEVICES"] = devices[local]
    dist.init_process_group("nccl")


def setup_torchrun():
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["LOCAL_RANK"]
    dist.init_process_group("nccl")


if __name__ == "__main__":
    setup()
    dist.destroy_process_group()
