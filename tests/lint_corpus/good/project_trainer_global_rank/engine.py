# The same trainer class, given the global rank: `self.rank < 1` holds on one process.
import os

import torch


class Engine:
    def __init__(self, model, out_dir, rank=-1):
        self.model = model
        self.out_dir = out_dir
        self.rank = rank

    def save(self, epoch):
        if self.rank < 1:
            path = os.path.join(self.out_dir, f"epoch{epoch}.pt")
            torch.save(self.model.module.state_dict(), path)
