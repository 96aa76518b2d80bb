# A checkpoint helper with a node-local guard that nothing in the project calls, imports or
# passes (issue 33, round 12): dead code runs on no node, so its write is not reported. The
# writer that is used guards with the global rank.
import os

import torch


def save_everything(model, config, folder):
    if config.local_rank == 0:
        os.makedirs(folder, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(folder, "model.pt"))


def save_model(model, folder):
    torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
