# The epoch loop reads the helper's loader through a progress bar bound to a name
# (`pbar = tqdm(loader)`): the same loader, whose sampler is never given the epoch.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from data import get_loader


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    loader = get_loader(batch_size=8, distributed=dist.get_world_size() > 1)
    for epoch in range(10):  # expect: GT005
        pbar = tqdm(loader, disable=dist.get_rank() != 0)
        for x, y in pbar:
            loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
