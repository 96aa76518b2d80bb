# Guide: Distributed Training: patterns and synchronisation, the WRONG half of "Avoiding
# Deadlocks" (shared/seeds/003), re-indented, with the validate() the guide leaves out: it
# reduces the metric over ranks, so ranks 1..N never meet rank 0 in that all_reduce.
import torch
import torch.distributed as dist


def validate(model, val_loader):
    total = torch.zeros(())
    for x, y in val_loader:
        total += (model(x).argmax(1) == y).sum()
    dist.all_reduce(total)
    return total.item()


# WRONG
if rank == 0:
    # Long validation
    validate(model, val_loader)  # expect: GT009

# Rank 1, 2, 3 reach barrier and wait forever!
dist.barrier()
