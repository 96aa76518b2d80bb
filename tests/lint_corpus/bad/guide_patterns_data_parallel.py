# Guide: Distributed Training: patterns and synchronisation, "DataParallel: Simple Multi-GPU"
# and "Limitations of DataParallel" (shared/seeds/003). Verbatim (re-indented) but for the
# expect markers: the guide shows DataParallel to explain why not to use it.
import torch
import torch.nn as nn

# Single GPU model
model = nn.Linear(10, 5)

# Wrap with DataParallel
device_ids = [0, 1, 2, 3] # GPUs 0, 1, 2, 3
model = nn.DataParallel(model, device_ids=device_ids)  # expect: GT001

# Model automatically splits batch across GPUs
batch_size = 32 # Total batch

# Forward/backward works same as single GPU
for epoch in range(10):
    for batch_x, batch_y in train_loader:
        output = model(batch_x) # Auto-splits batch
        loss = criterion(output, batch_y)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

# DataParallel issues:

# 3. Slower than DistributedDataParallel for large models

# Example
model = nn.DataParallel(model, device_ids=[0, 1, 2, 3])  # expect: GT001
