# Accumulation windows with DDP but no no_sync(): a GradScaler loop and the toolkit's
# should_step without gradient_sync.
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gpu_training.amp import should_step


def fp16_loop(model, loader, opt, accum, world_size):
    model = DDP(model)
    scaler = torch.amp.GradScaler()
    for step, (x, y) in enumerate(loader):
        with torch.autocast("cuda"):
            loss = model(x, y) / accum
        scaler.scale(loss).backward()  # expect: GT013
        if (step + 1) % accum == 0:
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()


def toolkit_loop(ddp_model, loader, optimizer, accum_steps):
    for micro, (x, y) in enumerate(loader):
        loss = ddp_model(x, y) / accum_steps
        loss.backward()  # expect: GT013
        if should_step(micro, accum_steps):
            optimizer.step()
            optimizer.zero_grad()
