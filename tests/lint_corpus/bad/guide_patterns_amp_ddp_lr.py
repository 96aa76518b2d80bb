# Guide: Distributed Training: patterns and synchronisation, "Mixed Precision with DDP"
# (shared/seeds/003). Verbatim (re-indented) but for the expect marker.
from torch.cuda.amp import autocast, GradScaler

model = nn.Linear(10, 5)
model = DDP(model)

optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # expect: GT010
scaler = GradScaler() # Scales loss to prevent underflow

for epoch in range(10):
    for batch_x, batch_y in train_loader:
        # Forward in float16
        with autocast(device_type='cuda'):
            output = model(batch_x)
            loss = criterion(output, batch_y)

        # Backward with loss scaling
        scaler.scale(loss).backward()

        # Unscale before update
        scaler.unscale_(optimizer)

        # Gradient clipping (optional)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)

        # Update
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
