# The best-checkpoint test made on a value every rank shares (issue 33, round 10): the score is
# all-reduced before the test (DDP), or is a step count (the same on every rank of an evenly
# sharded loader), so every rank takes the same branch and reaches the barrier.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main(train_set, val_set, epochs=3):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(16, 4).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 * dist.get_world_size())
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set))
    best = 0.0
    steps = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
            optimizer.step()
            steps += 1
            if steps % 100 == 0:
                dist.barrier()
        hits = torch.zeros(1, device="cuda")
        with torch.no_grad():
            for x, y in val_loader:
                hits += (model(x.cuda()).argmax(-1) == y.cuda()).sum()
        dist.all_reduce(hits)
        if hits.item() > best:
            best = hits.item()
            if dist.get_rank() == 0:
                torch.save(model.module.state_dict(), "best.pt")
            dist.barrier()
    dist.destroy_process_group()
