# set_epoch under the flag of one launch mode while the other mode builds a shuffling
# DistributedSampler too (its replicas given by hand): on that path the order repeats
# every epoch.
import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--use_ddp", action="store_true")
args = parser.parse_args()
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dataset = torch.utils.data.TensorDataset(torch.randn(64, 4))


def fit(model, loader, epochs):
    for epoch in range(epochs):  # expect: GT005
        if args.use_ddp:
            loader.sampler.set_epoch(epoch)
        for (x,) in loader:
            model(x.cuda()).sum().backward()


if args.use_ddp:
    sampler = DistributedSampler(dataset)
else:  # a DeepSpeed-style launch: the sampler is still distributed and shuffles
    sampler = DistributedSampler(
        dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True
    )
fit(torch.nn.Linear(4, 1).cuda(), DataLoader(dataset, batch_size=8, sampler=sampler), 3)
dist.destroy_process_group()


class Runner:
    def __init__(self, cfg):
        self.cfg = cfg
        if not cfg.ddp:
            self.sampler = DistributedSampler(dataset, seed=cfg.seed)
        else:
            self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=8, sampler=self.sampler)

    def run(self, model):
        for epoch in range(self.cfg.epochs):  # expect: GT005
            if self.cfg.ddp:
                self.sampler.set_epoch(epoch)
            for (x,) in self.loader:
                model(x.cuda()).sum().backward()


if os.environ.get("RUNNER"):  # the class-based variant of the same launch
    Runner(args).run(torch.nn.Linear(4, 1).cuda())
