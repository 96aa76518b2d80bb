"""A tiny DDP job built from ``train_one_epoch`` and ``CheckpointManager`` that resumes exactly.

Used by tests/test_elastic.py, tests/test_launch.py and benchmarks/elastic_recovery.py under
``gpu-training launch --nproc 2 [--max-restarts K] elastic_train.py CKPT_DIR``: an elastic
restart (torchrun starting the group again after a worker died) continues from the newest
checkpoint, and the final weights equal those of an uninterrupted run, bit for bit.

One epoch is ``--steps-per-epoch`` optimizer steps of 2 accumulated micro-batches each; a
checkpoint is written every ``--save-every`` epochs and at a preemption signal. Lines printed
(one write each, so ranks do not interleave inside a line):

* every rank, at start: ``rank R pid P attempt A`` (A = TORCHELASTIC_RESTART_COUNT);
* rank 0: ``resumed at step S`` after loading a checkpoint, ``step S`` after each epoch;
* every rank, at the end: ``rank R done step S weights CRC`` or, when a signal stopped it,
  ``rank R stopped at step S weights CRC`` (then exit code 143).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from gpu_training.amp import MixedPrecisionTrainer
from gpu_training.checkpoint import CheckpointManager
from gpu_training.ddp import (
    cleanup_distributed,
    init_distributed,
    make_distributed_sampler,
    train_one_epoch,
)
from gpu_training.preemption import PreemptionHandler, exit_preempted

MICRO_BATCH = 8
ACCUMULATION = 2


def say(line: str) -> None:
    """One write per line: the ranks share torchrun's stdout."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def weights_crc(state: dict[str, torch.Tensor]) -> int:
    """CRC32 of the tensors' bytes in key order: equal CRCs mean bit-equal weights."""
    crc = 0
    for tensor in state.values():
        crc = zlib.crc32(tensor.detach().contiguous().numpy().tobytes(), crc)
    return crc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ckpt_dir")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--steps-per-epoch", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=2, help="epochs between checkpoints")
    parser.add_argument("--sleep", type=float, default=0.1, help="seconds per epoch")
    args = parser.parse_args()

    ctx = init_distributed()
    say(f"rank {ctx.rank} pid {os.getpid()} attempt {os.environ.get('TORCHELASTIC_RESTART_COUNT')}")
    torch.manual_seed(0)  # the same data and initial weights on every rank and every attempt
    per_epoch = args.steps_per_epoch * ACCUMULATION * MICRO_BATCH * ctx.world_size
    inputs = torch.randn(per_epoch, 16)
    targets = inputs @ torch.randn(16, 4) + 0.1 * torch.randn(per_epoch, 4)
    dataset = TensorDataset(inputs, targets)
    sampler = make_distributed_sampler(dataset, ctx, shuffle=True, seed=1)
    loader = DataLoader(dataset, batch_size=MICRO_BATCH, sampler=sampler, shuffle=sampler is None)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ckpt = CheckpointManager(args.ckpt_dir, ctx=ctx, keep_last_n=2)
    start_epoch = 0
    if ckpt.latest() is not None:
        state = ckpt.load()
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = int(state["epoch"])
        if ctx.is_main_process:
            say(f"resumed at step {start_epoch * args.steps_per_epoch}")
    ddp: nn.Module = DistributedDataParallel(model) if ctx.is_distributed else model
    trainer = MixedPrecisionTrainer(optimizer, "fp32", ACCUMULATION)
    stopped = False
    epoch = start_epoch
    with ckpt, PreemptionHandler(ctx=ctx) as preemption:
        while epoch < args.epochs:
            train_one_epoch(ddp, loader, trainer, nn.functional.mse_loss, ctx, epoch=epoch)
            epoch += 1
            stop = preemption.should_stop()  # every rank, every epoch: a collective
            if epoch % args.save_every == 0 or epoch == args.epochs or stop:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                ckpt.save({**state, "epoch": epoch}, step=epoch * args.steps_per_epoch)
            if ctx.is_main_process:
                say(f"step {epoch * args.steps_per_epoch}")
            if stop:
                stopped = True
                break
            time.sleep(args.sleep)
    crc = weights_crc(model.state_dict())
    del ddp  # before the group goes: DDP's reducer can hang gloo at exit (docs/design.md, "Traps")
    word = "stopped at" if stopped else "done"
    say(f"rank {ctx.rank} {word} step {epoch * args.steps_per_epoch} weights {crc:08x}")
    if stopped:
        exit_preempted()
    cleanup_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
