"""Mixed precision + DDP, with the per-device batch sized to memory by the batch finder.

CPU, 2 processes (gloo):  torchrun --standalone --nproc_per_node=2 examples/train_amp.py
fp16 on the CPU:          torchrun --standalone --nproc_per_node=2 examples/train_amp.py --precision fp16
GPUs, one per process:    torchrun --standalone --nproc_per_node=8 examples/train_amp.py --max-batch 4096
One process, no torchrun: python examples/train_amp.py
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from gpu_training.amp import MixedPrecisionStepper, should_step
from gpu_training.config import scale_lr
from gpu_training.ddp import (
    DistributedContext,
    cleanup_distributed,
    gradient_sync,
    init_distributed,
    make_distributed_sampler,
    reduce_scalar_dict,
    resolve_device,
)
from gpu_training.profiling import find_max_batch_size, make_fits

FEATURES, CLASSES = 32, 4


def make_dataset(samples: int) -> TensorDataset:
    """Points labelled by a fixed random linear teacher: learnable, identical on every rank."""
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)
    x = torch.randn(samples, FEATURES, generator=gen)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def random_batch(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, FEATURES), torch.randint(CLASSES, (batch,))


def train(args: argparse.Namespace, ctx: DistributedContext) -> None:
    device = resolve_device(ctx)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES)).to(device)
    loss_fn = nn.functional.cross_entropy

    # Probe the bare model before DDP wraps it; every rank probes and all get the same answer.
    fits = make_fits(model, random_batch, loss_fn, precision=args.precision)
    batch_size = find_max_batch_size(fits, min_batch=8, max_batch=args.max_batch, ctx=ctx)

    ddp_model = DistributedDataParallel(model) if ctx.is_distributed else model
    dataset = make_dataset(args.samples)
    sampler = make_distributed_sampler(dataset, ctx, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size, shuffle=sampler is None, sampler=sampler)
    # The finder chose the per-device batch, so the effective batch is only known now: the LR
    # tuned at --base-batch follows it (the linear scaling rule), whatever the rank count.
    effective = batch_size * args.grad_accum * ctx.world_size
    lr = scale_lr(args.lr, args.base_batch, effective)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    stepper = MixedPrecisionStepper(
        optimizer, precision=args.precision, grad_accum_steps=args.grad_accum, max_grad_norm=1.0
    )
    # Only whole accumulation windows: a partial one would leak its gradient into the next epoch.
    micro_steps = len(loader) // args.grad_accum * args.grad_accum
    if args.steps:
        micro_steps = min(micro_steps, args.steps * args.grad_accum)
    if ctx.is_main_process:
        print(
            f"precision={stepper.precision} per-device batch={batch_size} "
            f"effective={effective} lr={lr:.3g}"
        )

    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        loss_sum = torch.zeros((), device=device)
        for micro_step, (x, y) in enumerate(loader):
            if micro_step == micro_steps:
                break
            x, y = x.to(device), y.to(device)
            # Off the boundary skip DDP's all-reduce: the gradient is still accumulating.
            with gradient_sync(ddp_model, enabled=should_step(micro_step, args.grad_accum)):
                with stepper.autocast():
                    loss = loss_fn(ddp_model(x), y)
                stepper.backward(loss)
            stepper.step(model.parameters(), micro_step)
            loss_sum += loss.detach().float()  # stays on the device: no host sync per step
        # Every rank joins the reduction; only rank 0 prints the global mean.
        metrics = reduce_scalar_dict({"loss": loss_sum / max(1, micro_steps)}, ctx)
        if ctx.is_main_process:
            print(f"epoch {epoch} loss {metrics['loss']:.4f}", flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "bf16"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps per epoch (0: all)")
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=64, help="batch finder ceiling")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument(
        "--lr", type=float, default=3e-3, help="learning rate tuned at --base-batch"
    )
    parser.add_argument("--base-batch", type=int, default=256, help="effective batch --lr is for")
    return parser.parse_args(argv)


@record  # torchrun then reports the rank that raised, not only the one it had to kill
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    ctx = init_distributed()
    try:
        train(args, ctx)  # returns first: the DDP model must be freed before the group is
    finally:
        cleanup_distributed()


if __name__ == "__main__":
    main()
