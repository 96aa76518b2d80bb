# The same modes as good/one_process_device_paths.py, but the fixed GPU index is where the
# process group runs: in the DDP mode itself and in a helper both modes call, every rank
# lands on the same GPU. Accumulating on the DDP model without no_sync() all-reduces every
# chunk (the one-process mode's accumulation in the good twin does not).
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def prepare(model):
    return model.to("cuda:0")  # expect: GT002


def run_single(model, x, y):
    model = prepare(model)
    torch.nn.functional.mse_loss(model(x), y).backward()


def run_ddp(model, x, y, lr):
    dist.init_process_group("nccl")
    device = torch.device("cuda:1")  # expect: GT002
    ddp_model = DDP(prepare(model).to(device))
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr)
    for xs, ys in zip(x.chunk(4), y.chunk(4)):
        loss = torch.nn.functional.mse_loss(ddp_model(xs.to(device)), ys.to(device))
        loss.backward()  # expect: GT013
    optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="single")
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    net = torch.nn.Linear(8, 1)
    inputs, targets = torch.randn(64, 8), torch.randn(64, 1)
    if args.mode == "single":
        run_single(net, inputs, targets)
    elif args.mode == "ddp":
        run_ddp(net, inputs, targets, args.lr)
