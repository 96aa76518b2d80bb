# An FSDP root built with an auto-wrap policy holds FSDP units inside: its `.module` is no
# plain model, and the state_dict() that save_pretrained() takes of it runs the units'
# all-gathers. Called on rank 0 only, it hangs (issue 33, set 10's save of the unwrapped
# root on `self.rank == 0`).
import functools
import os

import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy


class FineTuner:
    def __init__(self, model, out_dir):
        dist.init_process_group("nccl")
        self.rank = dist.get_rank()
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=10**6)
        self.model = FullyShardedDataParallel(model, auto_wrap_policy=policy)
        self.out_dir = out_dir

    def save(self):
        if self.rank == 0:
            to_save = self.model
            if hasattr(self.model, "module"):
                to_save = self.model.module
            to_save.save_pretrained(self.out_dir)  # expect: GT009


def export(model):
    wrapped = FullyShardedDataParallel(model, auto_wrap_policy=size_based_auto_wrap_policy)
    train(wrapped)
    if int(os.environ.get("RANK", "0")) == 0:
        wrapped.module.save_pretrained("final")  # expect: GT009
