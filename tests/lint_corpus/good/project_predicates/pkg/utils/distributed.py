# timm-style predicates: named neither "main" nor "master"; what they compute decides.
import os

import torch


def is_global_primary(args):
    return args.rank == 0


def is_local_primary(args):
    return args.local_rank == 0


def is_primary(args, local=False):
    return is_local_primary(args) if local else is_global_primary(args)


def init_distributed_device(args):
    args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(args.local_rank)
    torch.distributed.init_process_group(backend="nccl")
    args.rank = torch.distributed.get_rank()
    args.world_size = torch.distributed.get_world_size()
    return torch.device("cuda", args.local_rank)
