# As bad/accumulation_skip_continue.py, with the micro-batches that skip the step run under
# no_sync() (issue 33): DDP all-reduces once per optimizer step.
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
        if global_step % accumulation != 0:
            with model.no_sync():
                (model(**batch).loss / accumulation).backward()
            continue
        (model(**batch).loss / accumulation).backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
