# A helper whose writes sit in branches chosen by its arguments: the unguarded call on every
# rank passes a flag that takes it past every write (it only logs), and every call that
# reaches a write stands under a rank-0 test. No rank writes a shared file twice.
import os

import torch
import torch.distributed as dist


def checkpoint(model, step, path, dry_run=False):
    if dry_run:
        print(f"step {step}: would save to {path}")
        return
    if step % 1000 == 0:
        torch.save(model.module.state_dict(), os.path.join(path, f"step_{step}.pt"))
    else:
        torch.save(model.module.state_dict(), os.path.join(path, "latest.pt"))


def run(model, loader, path):
    dist.init_process_group("nccl")
    for step, batch in enumerate(loader):
        model(batch).sum().backward()
        if int(os.environ["RANK"]) == 0:
            checkpoint(model, step, path)
    checkpoint(model, -1, path, dry_run=True)
    dist.destroy_process_group()
