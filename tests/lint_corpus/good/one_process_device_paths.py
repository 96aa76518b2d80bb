# One-process modes beside a DDP mode in one script (issue 33): `cuda:0` / `cuda:3` in the
# functions only the one-process modes call pick a GPU for the only process there is, and
# the DDP mode gives every rank its own GPU with `torch.device("cuda", local_rank)` used
# everywhere (no set_device is needed when nothing lands on the current device).
# Accumulating gradients over chunks in a one-process mode needs no no_sync(): there is no
# all-reduce to skip.
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def run_single(model, x, y, steps, lr):
    device = torch.device("cuda:0")
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
        optimizer.step()


def run_accumulate(model, x, y, steps, lr):
    device = torch.device("cuda:3")
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        for xs, ys in zip(x.chunk(4), y.chunk(4)):
            loss = torch.nn.functional.mse_loss(model(xs.to(device)), ys.to(device)) / 4
            loss.backward()
        optimizer.step()


def run_model_parallel(model, x, y, steps, lr):
    for i, layer in enumerate(model.layers):
        layer.to(f"cuda:{i}")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y.to("cuda:3")).backward()
        optimizer.step()


def run_ddp(model, x, y, steps, lr):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    ddp_model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp_model(x.to(device)), y.to(device)).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="single")
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    net.layers = list(net)
    inputs, targets = torch.randn(64, 8), torch.randn(64, 1)
    if args.mode == "single":
        run_single(net, inputs, targets, 10, args.lr)
    elif args.mode == "accumulate":
        run_accumulate(net, inputs, targets, 10, args.lr)
    elif args.mode == "mp":
        run_model_parallel(net, inputs, targets, 10, args.lr)
    elif args.mode == "ddp":
        run_ddp(net, inputs, targets, 10, args.lr)
