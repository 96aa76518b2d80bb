import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from data import create_dataloader


def train(rank, world_size, dataset, val_dataset, lr):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    model = DDP(torch.nn.Linear(4, 1).cuda(rank), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    data_loader = create_dataloader(dataset, batch_size=8, world_size=world_size, rank=rank)  # expect: GT003
    val_loader = create_dataloader(val_dataset, batch_size=8)
    for x, y in data_loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        for x, y in val_loader:
            model(x)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(train, args=(2, None, None, 0.1), nprocs=2)
