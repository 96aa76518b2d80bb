# A helper module of a DDP project (issue 33, round 10): fit_accumulating accumulates with no
# no_sync(), but nothing in the project calls it (the entry point uses fit_epoch), so no
# DDP model ever reaches its loop.
import torch


def fit_epoch(model, loader, optimizer):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def fit_accumulating(model, loader, optimizer, accumulate=4):
    model.train()
    for i, (x, y) in enumerate(loader):
        torch.nn.functional.mse_loss(model(x), y).backward()
        if i % accumulate == accumulate - 1:
            optimizer.step()
            optimizer.zero_grad()
