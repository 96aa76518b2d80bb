import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from loops import train_epoch


def main(dataset, epochs, accum_steps, base_lr):
    dist.init_process_group("nccl")
    local_rank = dist.get_rank() % torch.cuda.device_count()
    torch.cuda.set_device(local_rank)
    model = FSDP(torch.nn.Linear(4, 1).cuda())
    optimizer = torch.optim.AdamW(model.parameters(), lr=base_lr * dist.get_world_size())
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        train_epoch(model, loader, optimizer, accum_steps)
    for step, (x, y) in enumerate(loader):  # one more pass, accumulated in place
        loss = torch.nn.functional.mse_loss(model(x), y) / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None, 2, 4, 1e-4)
