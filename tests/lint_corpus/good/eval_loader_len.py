# An evaluation loader measured with len() (a progress bar's total) and read only
# under no_grad (issue 33, round 10): every rank scores the whole set on purpose; len() draws
# no batch, so the loader stays an evaluation loader.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm


def score_all(dataset, model, batch_size=256):
    loader = DataLoader(dataset, batch_size=batch_size)
    steps = len(loader)
    total = 0.0
    for x, y in tqdm(loader, total=steps, disable=dist.get_rank() != 0):
        with torch.no_grad():
            total += (model(x.cuda()).argmax(-1) == y.cuda()).sum().item()
    return total


def main(train_set, val_set):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(16, 4).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 * dist.get_world_size())
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
            optimizer.step()
        accuracy = score_all(val_set, model) / len(val_set)
        if dist.get_rank() == 0:
            print(epoch, accuracy)
    dist.destroy_process_group()
