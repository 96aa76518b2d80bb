# A complete raw-PyTorch DDP script that gets every rule right: set_device, a distributed
# sampler with set_epoch, no_sync off the accumulation boundary, a scaled LR, rank-0 printing
# and saving of the unwrapped model, collectives on every rank, teardown.
import argparse
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--base-lr", type=float, default=1e-3)
    return p.parse_args()


def main():
    args = parse()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank)

    data = TensorDataset(torch.randn(1024, 16), torch.randint(0, 4, (1024,)))
    sampler = DistributedSampler(data, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=32, sampler=sampler, num_workers=2)
    val_loader = DataLoader(data, batch_size=64)
    model = DDP(nn.Linear(16, 4).to(device), device_ids=[local_rank])
    lr = args.base_lr * world * args.accum
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            boundary = (i + 1) % args.accum == 0
            with contextlib.nullcontext() if boundary else model.no_sync():
                loss = nn.functional.cross_entropy(model(x), y) / args.accum
                loss.backward()
            if boundary:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                total += torch.stack([(model(x).argmax(1) == y).sum(), torch.tensor(len(y))])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} accuracy {total[0] / total[1]:.3f}")
            torch.save(model.module.state_dict(), "model.pt")
        dist.barrier()
    del model
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
