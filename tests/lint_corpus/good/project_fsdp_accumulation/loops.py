# Gradient accumulation on an FSDP1 model (issue 33, round 6): every micro-batch's backward
# reduce-scatters, which is correct for FSDP; GT013 is about DDP's all-reduce per micro-batch.
import torch


def train_epoch(model, loader, optimizer, accum_steps):
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y) / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
