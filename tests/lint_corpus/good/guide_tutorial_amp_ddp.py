# Guide: PyTorch Distributed Training Tutorial, "Mixed Precision with DDP"
# (shared/seeds/001). Verbatim.
from torch.cuda.amp import GradScaler, autocast

scaler = GradScaler()

for x, y in loader:
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()

    with autocast():
        out = model(x)
        loss = criterion(out, y)

    scaler.scale(loss).backward()   # DDP all-reduce on unscaled grads
    scaler.step(optimizer)
    scaler.update()
