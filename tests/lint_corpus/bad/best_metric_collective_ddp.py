# The same pattern in a torchrun DDP script, the score returned by an evaluation helper that
# loops over the sharded loader it is given and reduces nothing (issue 33, round 10).
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def evaluate(model, loader):
    hits = 0
    with torch.no_grad():
        for x, y in loader:
            hits += int((model(x.cuda()).argmax(-1) == y.cuda()).sum())
    return hits / len(loader)


def main(train_set, val_set, epochs=3):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(16, 4).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 * dist.get_world_size())
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set))
    best = None
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
            optimizer.step()
        accuracy = evaluate(model, val_loader)
        if best is None or accuracy > best:
            best = accuracy
            dist.barrier()  # expect: GT009
            if dist.get_rank() == 0:
                torch.save(model.module.state_dict(), "best.pt")
    dist.destroy_process_group()
