"""DDP training with gpu_training's helpers — the Distributed Training Guide as one script.

Run on 2 CPU processes (gloo), on every GPU of a node (nccl) or in one process, unchanged:

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --epochs 3
    python examples/train_ddp.py --epochs 3

It shows each rule of the guide: set_device before the group (init_distributed), a sampler
that gives each rank its share of every global batch, with set_epoch (train_one_epoch),
no_sync off accumulation boundaries, a global batch that is explicit and a learning rate
scaled to it, metrics reduced over ranks and printed by rank 0 only, checkpoints written by
rank 0 atomically without ``module.`` prefixes, and a clean teardown. The global batch
defines the run: on 1, 2 or 4 processes it takes the same optimizer steps (promise 1).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from gpu_training.amp import MixedPrecisionTrainer
from gpu_training.checkpoint import CheckpointManager
from gpu_training.config import TrainingConfig
from gpu_training.ddp import (
    cleanup_distributed,
    init_distributed,
    make_distributed_sampler,
    resolve_device,
    train_one_epoch,
    unwrap_model,
)
from gpu_training.schedule import linear_warmup_cosine_lr


def make_dataset(num_samples: int, seed: int) -> TensorDataset:
    """A learnable 4-class problem: the label is the argmax of a fixed random projection."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, 32, generator=g)
    w = torch.randn(32, 4, generator=g)
    y = (x @ w + 0.1 * torch.randn(num_samples, 4, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 4))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per-device micro-batch")
    p.add_argument("--global-batch", type=int, default=128, help="samples per optimizer step")
    p.add_argument("--lr", type=float, default=3e-3, help="LR tuned at --base-batch")
    p.add_argument("--base-batch", type=int, default=128)
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "bf16"])
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=16, help="warmup optimizer steps")
    p.add_argument("--checkpoint-dir", default="runs/train_ddp/checkpoints")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    ctx = init_distributed()  # set_device(local_rank) happens inside, before the group
    try:
        device = resolve_device(ctx)
        dataset = make_dataset(args.samples, args.seed)
        cfg = TrainingConfig(
            global_batch_size=args.global_batch,  # accumulation = global / (batch x ranks)
            per_device_batch_size=args.batch_size,
            world_size=ctx.world_size,
            learning_rate=args.lr,
            base_batch_size=args.base_batch,
            warmup_steps=args.warmup,
            epochs=args.epochs,
            precision=args.precision,
            seed=args.seed,
        )
        if ctx.is_main_process:
            print(cfg.describe(num_samples=len(dataset)), flush=True)

        torch.manual_seed(cfg.seed)  # same init everywhere (DDP also broadcasts rank 0's)
        model = build_model().to(device)
        if ctx.is_distributed:  # one process (python examples/train_ddp.py) needs no wrapper
            model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

        # This rank's micro-batches of each global batch; the same steps on any rank count.
        sampler = make_distributed_sampler(
            dataset,
            ctx,
            shuffle=True,
            seed=cfg.seed,
            global_batch_size=args.global_batch,
            per_device_batch_size=cfg.per_device_batch_size,
        )
        loader = DataLoader(dataset, batch_sampler=sampler)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.scaled_learning_rate)
        scheduler = linear_warmup_cosine_lr(
            optimizer, warmup_steps=cfg.warmup_steps, total_steps=cfg.total_steps(len(dataset))
        )
        trainer = MixedPrecisionTrainer(
            optimizer,
            precision=cfg.precision,
            grad_accum_steps=sampler.gradient_accumulation_steps,
            max_grad_norm=cfg.max_grad_norm,
            max_nonfinite_steps=cfg.max_nonfinite_steps,  # a NaN step skipped on every rank
        )
        ckpt = CheckpointManager(args.checkpoint_dir, ctx=ctx, keep_last_n=2)
        loss_fn = nn.CrossEntropyLoss()

        global_step = 0
        for epoch in range(cfg.epochs):
            metrics = train_one_epoch(
                model, loader, trainer, loss_fn, ctx, epoch=epoch, scheduler=scheduler
            )
            global_step += int(metrics["steps"])
            if ctx.is_main_process:
                print(
                    f"epoch {epoch} step {global_step} loss {metrics['loss']:.4f} "
                    f"grad_norm {metrics['grad_norm']:.3f} lr {metrics['lr']:.2e}",
                    flush=True,
                )
            ckpt.save(  # every rank calls it: rank 0 writes, the others wait at the barrier
                state={
                    "model_state": unwrap_model(model).state_dict(),
                    "optimizer_state": optimizer.state_dict(),
                    "scheduler_state": scheduler.state_dict(),
                    "amp_state": trainer.state_dict(),
                    "sampler_state": sampler.state_dict(),
                    "epoch": epoch,
                },
                step=global_step,
            )
        if ctx.is_main_process:
            print(f"checkpoint: {ckpt.latest()}", flush=True)
        del model  # free DDP's reducer before the group goes (docs/design.md, "Traps")
    finally:
        cleanup_distributed()


if __name__ == "__main__":
    main()
