# A checkpoint helper called twice: periodically under a rank-0 guard, and once at the end on
# every rank with a flag that sends it down another branch. The branch only the unguarded call
# takes is written by every rank; the one only the guarded call takes is rank 0's alone
# (issue 33, set 10's save_checkpoint(..., save_cur=True) after the epoch loop).
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def save_checkpoint(args, epoch, model, final=False):
    state = {"model": model.module.state_dict(), "epoch": epoch}
    if final:
        torch.save(state, os.path.join(args.log_dir, "last.pth"))  # expect: GT007
    elif epoch % args.save_freq == 0:
        torch.save(state, os.path.join(args.log_dir, f"epoch_{epoch}.pth"))
    else:
        print("not saving")


def export(model, kind="periodic", out="out"):
    # the same split, by a string the callers pass
    if kind == "best":
        torch.save(model.module.state_dict(), f"{out}/best.pt")
    else:
        torch.save(model.module.state_dict(), f"{out}/weights.pt")  # expect: GT007


def main(args):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(build_model().cuda(), device_ids=[local_rank])
    best = float("inf")
    for epoch in range(args.epochs):
        loss = train_one_epoch(model, args)
        if dist.get_rank() == 0:
            save_checkpoint(args, epoch, model)
            if loss < best:
                best = loss
                export(model, kind="best")
    save_checkpoint(args, "last", model, final=True)
    export(model)
    dist.destroy_process_group()
