# no_sync() done right in three spellings: the forward inside the block and the backward
# outside it (improved-diffusion: the forward decides), the context chosen as a value
# (`ctx = model.no_sync if ... else nullcontext`), and nanoGPT's switch in a micro-batch loop.
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def forward_backward(ddp_model, batch, microbatch, optimizer):
    for i in range(0, batch.shape[0], microbatch):
        micro = batch[i : i + microbatch]
        last_batch = (i + microbatch) >= batch.shape[0]
        if last_batch:
            losses = ddp_model(micro)
        else:
            with ddp_model.no_sync():
                losses = ddp_model(micro)
        losses.mean().backward()
    optimizer.step()


def accumulate(model, loader, optimizer, accum):
    for step, batches in enumerate(loader):
        for i, batch in enumerate(batches):
            ctx = model.no_sync if i < len(batches) - 1 else contextlib.nullcontext
            with ctx():
                loss = model(batch).mean()
                loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def nanogpt(model, get_batch, optimizer, steps):
    for micro_step in range(steps):
        model.require_backward_grad_sync = micro_step == steps - 1
        loss = model(get_batch()).mean() / steps
        loss.backward()
    optimizer.step()


if __name__ == "__main__":
    dist.init_process_group("nccl")
    torch.cuda.set_device(0 if not dist.is_initialized() else dist.get_node_local_rank())
    model = DDP(build_model().cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size())
    forward_backward(model, torch.randn(8, 4).cuda(), 2, optimizer)
    dist.destroy_process_group()
