# Guide: Distributed Training: patterns and synchronisation, "DistributedDataParallel:
# Production-Grade" (shared/seeds/003). Verbatim (re-indented) but for the expect marker.
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def setup_ddp(rank, world_size):
    """Initialize distributed training."""
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'

    # Initialize process group
    dist.init_process_group(
        backend='nccl', # NVIDIA collective communication library
        rank=rank,
        world_size=world_size,
    )

def cleanup_ddp():
    """Clean up distributed training."""
    dist.destroy_process_group()

def train_ddp(rank, world_size, model_class, train_loader):
    """Training function for single process."""
    # Setup
    setup_ddp(rank, world_size)

    # Create model and wrap with DDP
    model = model_class()
    model.to(rank) # Move to current GPU
    model = DDP(model, device_ids=[rank])

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # expect: GT010

    # Training loop
    for epoch in range(10):
        # Important: shuffle differently on each rank
        train_loader.sampler.set_epoch(epoch)

        for batch_x, batch_y in train_loader:
            batch_x = batch_x.to(rank)
            batch_y = batch_y.to(rank)

            # Forward
            output = model(batch_x)
            loss = criterion(output, batch_y)

            # Backward
            optimizer.zero_grad()
            loss.backward()

            # DDP automatically synchronizes gradients
            optimizer.step()

    cleanup_ddp()

# Launch training on 4 GPUs
if __name__ == '__main__':
    world_size = 4
    mp.spawn(train_ddp, args=(world_size, MyModel, train_loader), nprocs=world_size)
