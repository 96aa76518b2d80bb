# The wrapper's state_dict inside a checkpoint dict built first, in a with block, and the
# wrapper object itself pickled from a trainer class.
import torch
from torch.nn.parallel import DistributedDataParallel


def save(model, optimizer, path, ctx):
    with torch.no_grad():
        ddp_model = DistributedDataParallel(model)
        state = {
            "model": ddp_model.state_dict(),  # expect: GT006
            "optimizer": optimizer.state_dict(),
        }
    if ctx.is_main_process:
        torch.save(state, path)


class Trainer:
    def __init__(self, model):
        self.model = DistributedDataParallel(model)

    def export(self, path):
        if self.is_main_process:
            torch.save(self.model, path)  # expect: GT006
