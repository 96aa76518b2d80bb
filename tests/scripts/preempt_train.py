"""A tiny DDP training loop that checkpoints and exits cleanly when it is preempted.

Used by tests/test_preemption.py: ``torchrun --nproc_per_node=2 preempt_train.py CKPT_DIR``
(or plain ``python``, one process). Every rank prints ``rank R pid P`` once the handler is
installed, rank 0 prints ``step N`` after each step, and a stopped rank prints
``rank R stopped at step N weights CRC32`` before exiting with ``EXIT_PREEMPTED``.
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

from gpu_training.checkpoint import CheckpointManager
from gpu_training.ddp import cleanup_distributed, init_distributed
from gpu_training.preemption import PreemptionHandler, exit_preempted


def say(line: str) -> None:
    """One write per line: both ranks share torchrun's stdout, and print() may write twice."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def weights_crc(state: dict[str, torch.Tensor]) -> int:
    """CRC32 of the tensors' bytes in key order (the test recomputes it from the checkpoint)."""
    crc = 0
    for tensor in state.values():
        crc = zlib.crc32(tensor.detach().contiguous().numpy().tobytes(), crc)
    return crc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ckpt_dir")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds per step")
    parser.add_argument("--save-every", type=int, default=3, help="async save period")
    args = parser.parse_args()

    ctx = init_distributed()
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    ddp: nn.Module = DistributedDataParallel(model) if ctx.is_distributed else model
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(100 + ctx.rank)  # each rank its own shard
    ckpt = CheckpointManager(args.ckpt_dir, ctx=ctx, keep_last_n=2)
    stopped_at = None
    with ckpt, PreemptionHandler(ctx=ctx) as preemption:
        say(f"rank {ctx.rank} pid {os.getpid()}")
        for step in range(1, args.steps + 1):
            loss = ddp(torch.randn(8, 16, generator=data)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            if step % args.save_every == 0:
                ckpt.save(state, step=step, async_save=True)
            if preemption.should_stop():  # every rank, same step: a collective
                ckpt.save(state, step=step)  # waits for the async save first
                stopped_at = step
                break
            if ctx.is_main_process:
                say(f"step {step}")
            time.sleep(args.sleep)
    crc = weights_crc(model.state_dict())
    del ddp  # before the group goes: DDP's reducer can hang gloo at exit (docs/design.md, "Traps")
    if stopped_at is not None:
        say(f"rank {ctx.rank} stopped at step {stopped_at} weights {crc:08x}")
        exit_preempted()
    cleanup_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
