# Guide: Distributed Training: patterns and synchronisation, "Practical Example: Complete DDP
# Training" (shared/seeds/003). Verbatim (re-indented) but for the expect marker.
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
import torch.distributed as dist
import torch.multiprocessing as mp

class SimpleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 20)
        self.fc2 = nn.Linear(20, 5)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        return self.fc2(x)

def train(rank, world_size):
    # Setup
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
    dist.init_process_group("nccl", rank=rank, world_size=world_size)

    # Create model
    model = SimpleModel()
    model.to(rank)
    model = DDP(model, device_ids=[rank])

    # Data
    dataset = TensorDataset(
        torch.randn(1000, 10),
        torch.randint(0, 5, (1000,))
    )
    sampler = DistributedSampler(dataset, rank=rank, world_size=world_size)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    # Optimizer
    optimizer = optim.SGD(model.parameters(), lr=0.01)  # expect: GT010
    criterion = nn.CrossEntropyLoss()

    # Training
    for epoch in range(10):
        sampler.set_epoch(epoch)

        for batch_x, batch_y in loader:
            batch_x, batch_y = batch_x.to(rank), batch_y.to(rank)

            output = model(batch_x)
            loss = criterion(output, batch_y)

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        if rank == 0:
            print(f"Epoch {epoch}: loss={loss.item():.4f}")

    dist.destroy_process_group()

if __name__ == '__main__':
    world_size = 4
    mp.spawn(train, args=(world_size,), nprocs=world_size)
