# The same split written right (issue 33, round 10): the helper runs all but the last
# micro-batch under no_sync(), so DDP all-reduces once per optimizer step.
import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(loader, micro):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(16, 1).cuda(), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3 * dist.get_world_size())

    def run_micro_batches(batch):
        parts = torch.split(batch, micro)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            with contextlib.nullcontext() if last else model.no_sync():
                model(part.cuda()).mean().backward()

    for batch in loader:
        opt.zero_grad()
        run_micro_batches(batch)
        opt.step()
    dist.destroy_process_group()
