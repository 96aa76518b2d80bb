# bad/set_epoch_one_path.py done right (issue 33, round 6): set_epoch under the same
# condition the loader helper builds its DistributedSampler under.
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
    for epoch in range(args.epochs):
        if spawned or ddp:
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    if spawned or ddp:
        dist.destroy_process_group()
