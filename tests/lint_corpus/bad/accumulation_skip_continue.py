# Gradient accumulation written as a skip (issue 33): the backward of the DDP model runs on
# every micro-batch, `continue` skips the step until the boundary, and no no_sync() keeps
# DDP from all-reducing on the micro-batches that do not step.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, loader, accumulation):
    dist.init_process_group("nccl")
    model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4 * dist.get_world_size())
    global_step = 0
    for batch in loader:
        global_step += 1
        loss = model(**batch).loss / accumulation
        loss.backward()  # expect: GT013
        if global_step % accumulation != 0:
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
