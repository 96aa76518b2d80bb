# Guide: PyTorch Distributed Training: Multi-GPU Guide 2025, "Scaling Tips"
# (shared/seeds/004). Verbatim.
base_lr = 1e-4
effective_batch = batch_size * num_gpus * grad_accum
lr = base_lr * (effective_batch / base_batch)

for i, batch in enumerate(dataloader):
    loss = model(batch).loss / accumulation_steps
    loss.backward()
    
    if (i + 1) % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()

from torch.cuda.amp import autocast, GradScaler

scaler = GradScaler()

with autocast():
    outputs = model(inputs)
    loss = criterion(outputs, labels)

scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
