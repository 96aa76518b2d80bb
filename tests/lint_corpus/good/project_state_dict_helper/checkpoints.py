# The same save helpers as bad/project_state_dict_helper/checkpoints.py (issue 33),
# handed the bare model (`net.module`) by train.py: the keys carry no `module.` prefix.
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
