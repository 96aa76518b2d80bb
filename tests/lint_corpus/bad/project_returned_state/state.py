# The training state of the project (issue 33, round 7): built by a function that returns an
# instance, so `state.save(...)` in train.py runs TrainState.save, in this module.
import os

import torch


class TrainState:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def save(self, path):
        os.makedirs(path, exist_ok=True)
        torch.save(self.model.state_dict(), os.path.join(path, "model.pth"))  # expect: GT017
        torch.save(self.optimizer.state_dict(), os.path.join(path, "opt.pth"))  # expect: GT017


def make_state(model, optimizer):
    state = TrainState(model, optimizer)
    return state
