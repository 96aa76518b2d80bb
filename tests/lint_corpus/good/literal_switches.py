# Single-process switches spelled as comparisons with a literal (issue 33): the `else:` of
# `if args.ddp == True:` and the body of `if args.mode == "OFF":` run in one process, as the
# branches that create the process group show (`args.ddp == True`, `args.mode == "ON"`).
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def build(args, dataset):
    if args.ddp == True:  # noqa: E712
        dist.init_process_group("nccl")
    if args.ddp == True:  # noqa: E712
        loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
    else:
        loader = DataLoader(dataset, batch_size=8, shuffle=True)
    return loader


def train(args, model, loader, optimizer):
    if args.mode == "OFF":
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        torch.save(model.state_dict(), "model.pt")
    if args.mode == "ON":
        dist.init_process_group("nccl")
        ddp_model = DDP(model)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(ddp_model(x), y).backward()
            optimizer.step()
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), "model.pt")
        dist.destroy_process_group()


def build_with_unseen_setup(args, dataset):
    # the group is created by a helper this file does not show; the loader built with a
    # DistributedSampler on the other path says which side is the single-process one
    if args.use_ddp == True:  # noqa: E712
        start_workers(args)
        loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
    else:
        loader = DataLoader(dataset, batch_size=8, shuffle=True)
    for x, y in loader:
        train_step(x, y)
