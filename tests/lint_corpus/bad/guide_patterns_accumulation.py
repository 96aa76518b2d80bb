# Guide: Distributed Training: patterns and synchronisation, "Advanced: Gradient Accumulation
# with DDP" (shared/seeds/003). Verbatim (re-indented) but for the expect markers: every
# micro-batch all-reduces, the trap the other guides' no_sync() avoids.
import torch
import torch.nn as nn

# Training with gradient accumulation
model = nn.Linear(10, 5)
model = DDP(model)

optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # expect: GT010
criterion = nn.MSELoss()

# Simulate batch size 128 with gradient accumulation
effective_batch_size = 128
actual_batch_size = 32
accumulation_steps = effective_batch_size // actual_batch_size

for epoch in range(10):
    train_loader.sampler.set_epoch(epoch)

    for batch_idx, (batch_x, batch_y) in enumerate(train_loader):
        # Forward
        output = model(batch_x)

        # Loss scaled by accumulation steps
        loss = criterion(output, batch_y) / accumulation_steps

        # Backward: gradients accumulate
        loss.backward()  # expect: GT013

        # Update after K steps
        if (batch_idx + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
