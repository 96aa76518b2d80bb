# A GradScaler around bfloat16 autocast: dtype given directly, and through a variable.
import torch
from torch.amp import GradScaler

scaler = torch.cuda.amp.GradScaler()  # expect: GT011
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def other_loop(model, batches):
    amp_dtype = torch.bfloat16
    grad_scaler = GradScaler("cuda", enabled=True)  # expect: GT011
    for batch in batches:
        with torch.autocast(device_type="cuda", dtype=amp_dtype):
            loss = model(batch)
        grad_scaler.scale(loss).backward()


def step(model, batch, optimizer, scaler):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(batch)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def outer_loop(model, batches, optimizer):
    # the scaler's function has no autocast; the step it is passed to autocasts to bf16
    scaler = GradScaler("cuda")  # expect: GT011
    for batch in batches:
        step(model, batch, optimizer, scaler)
