# The micro-batches of one step in a helper, the step after each call of it (issue 33, round
# 10): every micro-batch's backward all-reduces through DDP; no_sync() is never used. The
# evaluation call under no_grad() runs no backward and does not count.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Stepper:
    def __init__(self, model):
        self.model = model

    def apply(self, optimizer):
        self._clip()
        self._update(optimizer)

    def _clip(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)

    def _update(self, optimizer):
        optimizer.step()


def main(loader, val_batches, micro):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(16, 1).cuda(), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3 * dist.get_world_size())
    stepper = Stepper(model)

    def run_micro_batches(batch):
        for i, part in enumerate(torch.split(batch, micro)):
            loss = model(part.cuda()).mean()
            if i == 0:
                opt.zero_grad()
            if loss.requires_grad:
                loss.backward()  # expect: GT013

    for batch in loader:
        run_micro_batches(batch)
        stepper.apply(opt)
        with torch.no_grad():
            run_micro_batches(val_batches)
    dist.destroy_process_group()
