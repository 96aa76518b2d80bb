# Two distributed modes (issue 33, round 6): the loader helper builds a shuffling
# DistributedSampler in either, but the epoch loop calls set_epoch in one of them only.
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def build_loader(dataset, batch_size, distributed):
    sampler = DistributedSampler(dataset) if distributed else None
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=sampler is None)


def train(args, model, dataset, optimizer):
    spawned, ddp = args.distributed, args.ddp
    if spawned or ddp:
        dist.init_process_group("nccl")
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
        model = torch.nn.parallel.DistributedDataParallel(model.cuda())
    loader = build_loader(dataset, args.batch_size, distributed=spawned or ddp)
    for epoch in range(args.epochs):  # expect: GT005
        if ddp:
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    if spawned or ddp:
        dist.destroy_process_group()
