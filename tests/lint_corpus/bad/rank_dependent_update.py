# Learning-rate and optimizer changes on rank 0 only: the replicas drift apart.
import torch


def train(ctx, optimizer, scheduler, loss, epoch):
    loss.backward()
    if ctx.is_main_process:
        scheduler.step()  # expect: GT014
    if ctx.rank == 0 and epoch == 30:
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * 0.1  # expect: GT014
    if torch.distributed.get_rank() == 0:
        optimizer.step()  # expect: GT014


def train_with_a_group_from_a_call(rank, optimizer, epoch):
    group = optimizer.param_groups[0]
    if rank == 0 and epoch == 30:
        group["lr"] = 0.01  # expect: GT014
