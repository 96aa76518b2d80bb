# Rank guards as YOLO-style scripts write them (issue 33): membership in a set or a range that
# holds 0 and the "not launched distributed" -1, and helpers whose argument turns their
# barrier off - `torch_distributed_zero_first(-1)` and `evaluate(..., is_eval=True)` - called
# on rank 0 only. None of these is a finding.
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist

RANK = int(os.getenv("RANK", -1))
LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))


@contextmanager
def torch_distributed_zero_first(local_rank):
    if local_rank not in [-1, 0]:
        dist.barrier(device_ids=[local_rank])
    yield
    if local_rank == 0:
        dist.barrier(device_ids=[0])


def check_dataset(path):
    return path


def evaluate(model, is_eval=False):
    if is_eval:
        return model
    dist.barrier()
    return model


def main(model):
    dist.init_process_group("nccl")
    torch.cuda.set_device(LOCAL_RANK)
    with torch_distributed_zero_first(LOCAL_RANK):
        check_dataset("train")
    if RANK in {-1, 0}:
        with torch_distributed_zero_first(-1):
            check_dataset("val")
        evaluate(model, is_eval=True)
        torch.save(model.state_dict(), "last.pt")
    if dist.get_rank() in range(1):
        torch.save(model.state_dict(), "best.pt")
    if RANK not in {-1, 0}:
        pass
    else:
        torch.save(model.state_dict(), "final.pt")
    dist.destroy_process_group()
