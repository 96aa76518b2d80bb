import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from tools.config import save_config, write_start_config


def main(args, model, loader, optimizer):
    write_start_config(args)  # expect: GT007 (the call of the writer, on every rank)
    if args.dist == "OFF":
        for epoch in range(args.epochs):
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
            save_config(args, epoch)
    if args.dist == "ON":
        init_process_group(backend="nccl")
        model = DDP(model)
        for epoch in range(args.epochs):
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
        destroy_process_group()
