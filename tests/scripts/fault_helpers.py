"""A hand-written DDP loop on the helper API, as the guides write it, with a planted fault.

``torchrun --nproc_per_node=2 fault_helpers.py OUT_DIR`` (``tests/scripts`` on ``PYTHONPATH``):
``@entry_point`` on ``main``, ``try: ... finally: cleanup_distributed()`` (lint rule GT015's
advice), a DataLoader with one worker process, a ``CheckpointManager`` save every 2 steps,
an evaluation every 4 steps, ``StallWatchdog.from_env`` (``GPU_TRAINING_STALL_TIMEOUT``) and
debug mode from ``GPU_TRAINING_DEBUG``. The fault comes from tests/scripts/fault_task.py
(``FAULT_KIND``, ``FAULT_WHERE``, ``FAULT_RANK``); used by tests/test_faults.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import fault_task
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from gpu_training.checkpoint import CheckpointManager
from gpu_training.ddp import (
    cleanup_distributed,
    init_distributed,
    make_distributed_sampler,
    reduce_scalar_dict,
)
from gpu_training.watchdog import StallWatchdog, entry_point

STEPS, BATCH = 12, 4


@entry_point
def main(out: str) -> int:
    ctx = init_distributed()
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(fault_task.build_model())
        train_set, val_set = fault_task.build_data(BATCH)
        sampler = make_distributed_sampler(train_set, ctx)
        loader = DataLoader(train_set, batch_size=BATCH, sampler=sampler, num_workers=1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        ckpt = CheckpointManager(Path(out) / "checkpoints", ctx=ctx, keep_last_n=2)
        with StallWatchdog.from_env(ctx) as watchdog:
            for step, (x, y) in enumerate(loader, start=1):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                watchdog.tick(step)
                if step % 2 == 0:
                    state = {"model": model.module.state_dict(), "step": step}
                    ckpt.save(state, step=step)
                if step % 4 == 0:
                    model.eval()
                    with torch.no_grad():
                        val = sum(
                            torch.nn.functional.cross_entropy(model(vx[None]), vy[None])
                            for vx, vy in (val_set[i] for i in range(4))
                        )
                    model.train()
                    reduce_scalar_dict({"val": val}, ctx)
                watchdog.tick(step)
                if step >= STEPS:
                    break
        del model  # before the group goes: DDP's reducer (docs/design.md, "Traps")
    finally:
        cleanup_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
