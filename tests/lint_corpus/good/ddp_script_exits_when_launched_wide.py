# A DDP-ready script whose author has not written the sharded loader yet: it exits when launched
# with more than one process, so its plain shuffled DataLoader only runs in a world of one.
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def main():
    dist.init_process_group("gloo")
    if dist.get_world_size() > 1:
        print("multi-process data loading is not written yet")
        sys.exit(1)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    train_loader = DataLoader(data, batch_size=8, shuffle=True)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    for x, y in train_loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()


main()
