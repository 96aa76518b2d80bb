# GT011 read per function (issue 33, round 6): the GradScaler lives in a loop with no autocast
# (fp32, where a scaler only costs a little); the bf16 autocast is in another loop, with no
# scaler. Neither is "a GradScaler with bf16 autocast".
import torch


def train_fp32(model, loader, optimizer):
    scaler = torch.amp.GradScaler()
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


def train_bf16(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
