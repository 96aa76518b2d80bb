# The same kind of strategy switch, but the save's `else:` covers "fsdp" as well as "single":
# "fsdp" sets up a process group (the branch of main that calls init_process_group), so in an
# FSDP run every rank writes the file.
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def save(state, mode, path):
    if mode == "hybrid":
        if dist.get_rank() == 0:
            torch.save(state, path)
    else:
        torch.save(state, path)  # expect: GT007


def main(mode):
    if mode == "single":
        model = build_model().cuda()
    elif mode in ("fsdp", "hybrid"):
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        model = FSDP(build_model().cuda())
    else:
        raise ValueError(mode)
    train(model)
    save(model.state_dict(), mode, "final.pt")
