# Guide: PyTorch Distributed Training Tutorial, "Scaling the Learning Rate"
# (shared/seeds/001). Verbatim.
base_lr = 1e-3
num_gpus = dist.get_world_size()
scaled_lr = base_lr * num_gpus   # scale linearly

optimizer = torch.optim.AdamW(model.parameters(), lr=scaled_lr)

# Warmup for first 5 epochs, then cosine decay
from torch.optim.lr_scheduler import OneCycleLR
scheduler = OneCycleLR(
    optimizer,
    max_lr=scaled_lr,
    epochs=50,
    steps_per_epoch=len(loader),
    pct_start=0.1    # 10% warmup
)
