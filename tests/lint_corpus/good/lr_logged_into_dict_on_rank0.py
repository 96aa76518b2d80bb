# The learning rate copied into logging structures on local rank 0 (issue 33, set 12): a
# TensorBoard scalar dict and a tqdm postfix get an ['lr'] entry; no optimizer param group
# changes, so no rank trains with another learning rate.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


def train(model, loader, scheduler_factory):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    model = DDP(model.cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4 * dist.get_world_size())
    scheduler = scheduler_factory(optimizer)
    writer = SummaryWriter() if local_rank == 0 else None
    bar = tqdm(loader) if local_rank == 0 else loader
    for step, batch in enumerate(bar):
        losses = {"loss": model(batch.cuda(local_rank)).mean()}
        losses["loss"].backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if local_rank == 0 and writer is not None:
            batch_log = {k: v.item() for k, v in losses.items()}
            batch_log["lr"] = scheduler.get_last_lr()[0]
            for key, value in batch_log.items():
                writer.add_scalar(key, value, step)
        if local_rank == 0:
            postfix = dict(loss=f"{losses['loss'].item():.4f}")
            postfix["lr"] = f"{optimizer.param_groups[0]['lr']:.2e}"
            bar.set_postfix(postfix)
    dist.destroy_process_group()
