# fp16 with a GradScaler: clipping the scaled gradients (no unscale_, or unscale_ too late).
import torch
from torch import nn
from torch.cuda.amp import GradScaler, autocast

scaler = GradScaler()


def step(model, opt, x, y):
    with autocast():
        loss = nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # expect: GT012
    scaler.step(opt)
    scaler.update()


def step_late_unscale(model, opt, loss):
    scaler.scale(loss).backward()
    nn.utils.clip_grad_value_(model.parameters(), 0.5)  # expect: GT012
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
