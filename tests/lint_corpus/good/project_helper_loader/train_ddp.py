import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from data import create_dataloader, create_sharded_loader


def train(rank, world_size, dataset, epochs, lr):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    model = DDP(torch.nn.Linear(4, 1).cuda(rank), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    data_loader = create_dataloader(dataset, batch_size=8, world_size=world_size, rank=rank)
    for epoch in range(epochs):
        data_loader.sampler.set_epoch(epoch)
        for x, y in data_loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    shard_loader = create_sharded_loader(dataset, 8, rank, world_size)
    for x, y in shard_loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(train, args=(2, None, 3, 0.1), nprocs=2)
