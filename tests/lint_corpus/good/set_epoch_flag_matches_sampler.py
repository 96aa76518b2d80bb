# set_epoch under the flag that decides whether the sampler shuffles across ranks: the
# other side has no shuffling distributed sampler (a local one, or an ordered shard).
import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

parser = argparse.ArgumentParser()
parser.add_argument("--use_ddp", action="store_true")
parser.add_argument("--ordered", action="store_true")
args = parser.parse_args()
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dataset = torch.utils.data.TensorDataset(torch.randn(64, 4))

if args.use_ddp:
    sampler = DistributedSampler(dataset)
else:
    sampler = RandomSampler(dataset)
loader = DataLoader(dataset, batch_size=8, sampler=sampler)
if not args.ordered:
    eval_sampler = DistributedSampler(dataset, shuffle=False)
model = torch.nn.Linear(4, 1).cuda()
for epoch in range(3):
    if args.use_ddp:
        sampler.set_epoch(epoch)
    for (x,) in loader:
        model(x.cuda()).sum().backward()
dist.destroy_process_group()
