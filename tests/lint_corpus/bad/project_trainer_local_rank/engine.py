# A trainer class keeps the rank it is given; the script gives it LOCAL_RANK (train.py), so
# `self.rank < 1` holds on local rank 0 of every node and each node writes the same files.
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
            torch.save(self.model.module.state_dict(), path)  # expect: GT017
