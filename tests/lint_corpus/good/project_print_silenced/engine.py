# The training loop lives in its own module; print is already silenced by utils.
import math
import sys


def train_one_epoch(model, criterion, data_loader, optimizer, epoch):
    model.train()
    for step, (samples, targets) in enumerate(data_loader):
        loss = criterion(model(samples), targets)
        if not math.isfinite(loss.item()):
            print(f"Loss is {loss.item()}, stopping training")
            sys.exit(1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
