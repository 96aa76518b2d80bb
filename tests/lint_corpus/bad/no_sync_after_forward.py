# no_sync() entered after the forward: DDP already prepared the all-reduce, so the block
# changes nothing.
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, loader, optimizer, scaler, accum):
    model = DDP(model)
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y) / accum
        if (i + 1) % accum != 0:
            with model.no_sync():
                scaler.scale(loss).backward()  # expect: GT016
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    for i, (x, y) in enumerate(loader):
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        context = model.no_sync() if (i + 1) % accum != 0 else contextlib.nullcontext()
        with context:
            loss.backward()  # expect: GT016
        if (i + 1) % accum == 0:
            optimizer.step()


if __name__ == "__main__":
    dist.init_process_group("nccl")
    train(build_model(), build_loader(), build_optimizer(), torch.cuda.amp.GradScaler(), 4)
    dist.destroy_process_group()
