# Lightning scripts whose saves run once (issue 33): a rank-0 guard after fit() under the
# default DDP strategy, one device, and ddp_spawn (its children run fit() only; the script
# goes on in the one parent process). The split file written before fit() is written by
# the launching process alone: the other processes start inside fit() and find it there.
import json
import os

import lightning as L
import torch


def write_splits(path, keys):
    if os.path.exists(path):
        return path
    with open(path, "w") as f:
        json.dump({"train": keys[10:], "val": keys[:10]}, f)
    return path


def main(model, loader, epochs, keys):
    write_splits("splits.json", keys)
    trainer = L.Trainer(devices="auto", max_epochs=epochs)
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        torch.save(model.state_dict(), "weights.pth")


def single(model, loader):
    trainer = L.Trainer(accelerator="gpu", devices=1)
    trainer.fit(model, loader)
    torch.save(model.state_dict(), "single.pth")


def spawned(model, loader):
    trainer = L.Trainer(accelerator="gpu", devices=4, strategy="ddp_spawn")
    trainer.fit(model, loader)
    torch.save(model.state_dict(), "spawned.pth")
