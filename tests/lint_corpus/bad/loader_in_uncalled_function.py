# Two training functions of a DDP script build plain shuffled loaders. The one main() calls
# gives every rank the same batches; the other is named nowhere in the project (a leftover
# experiment nobody calls or imports), so it never runs and its loader feeds nothing.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader


def fit_round(model, dataset, optimizer):
    loader = DataLoader(dataset, batch_size=32, shuffle=True)  # expect: GT003
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def legacy_pseudo_label_rounds_r11(model, labeled, optimizer, rounds):
    for _ in range(rounds):
        loader = DataLoader(labeled, batch_size=32, shuffle=True, drop_last=True)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(build_model().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    fit_round(model, build_dataset(), optimizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
