# Guide: Distributed Training: patterns and synchronisation, "Single-GPU Training Baseline"
# (shared/seeds/003). Verbatim, re-indented (the source lost its indentation).
import torch
import torch.nn as nn
import torch.optim as optim

# Model and optimizer
model = nn.Linear(10, 5)
optimizer = optim.SGD(model.parameters(), lr=0.01)
criterion = nn.MSELoss()

# Single GPU training
for epoch in range(10):
    for batch_x, batch_y in train_loader:
        # Forward
        output = model(batch_x)
        loss = criterion(output, batch_y)

        # Backward
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
