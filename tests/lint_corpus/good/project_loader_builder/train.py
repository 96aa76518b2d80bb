import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from data import get_file_loader, get_train_loader, progress


def train(net, train_loader, optimizer):
    bar = progress(train_loader)
    for x, y in bar:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()


def main(args, dataset, files):
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    net = DDP(torch.nn.Linear(4, 1).cuda())
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    train_loader, _ = get_train_loader(dataset, 8, distributed=True)
    for epoch in range(args.epochs):
        train_loader.sampler.set_epoch(epoch)
        train(net, train_loader, optimizer)
    for epoch in range(args.epochs):
        for part in files:
            loader = get_file_loader(part, 8)
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(net(x), y).backward()
                optimizer.step()
    dist.destroy_process_group()
