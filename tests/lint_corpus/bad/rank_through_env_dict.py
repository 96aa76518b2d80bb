# The rank read through a copy of the environment and through args (issue 33): both are the
# global rank, so on a second node they name a GPU that is not there.
import os
import torch
import torch.distributed as dist


def main(args):
    env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    rank = int(env["RANK"])
    torch.cuda.set_device(rank)  # expect: GT018
    args.rank = int(os.environ["RANK"])
    torch.cuda.set_device(args.rank)  # expect: GT018
    dist.init_process_group("nccl")
    dist.destroy_process_group()
