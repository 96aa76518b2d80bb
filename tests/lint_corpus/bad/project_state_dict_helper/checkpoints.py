# Save helpers of the project (issue 33): each puts a parameter's state_dict() into what
# torch.save writes. Handed the DDP wrapper, the keys carry `module.` (reported at the call,
# in train.py); handed the bare model, they do not.
import os

import torch


def save_model(net, optimizer, epoch, save_path):
    model_state = net.state_dict()
    state = {"model": model_state, "optimizer": optimizer.state_dict(), "epoch": epoch}
    torch.save(state, os.path.join(save_path, f"ep{epoch:03d}.pth"))


def save_check_point(model, ckpt_dir, args):
    os.makedirs(ckpt_dir, exist_ok=True)
    torch.save(args, os.path.join(ckpt_dir, "args.bin"))
    torch.save(model.state_dict(), os.path.join(ckpt_dir, "model.pt"))
