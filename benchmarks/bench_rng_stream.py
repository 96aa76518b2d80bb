"""What the per-micro-batch random stream costs a step (promise 1 with dropout on).

``train_step`` seeds torch's generator from (seed, step, micro-batch index) before each
micro-batch and restores it after (:func:`gpu_training.rng.micro_batch_rng`). This times the
same optimizer steps with that stream and with the old path (no stream: the rank's own
generator), interleaved in the same rounds, on the built-in character model with dropout
0.1 — the demo's shape and a tiny one where a fixed cost shows most. Figures are medians of
per-round step times; the ratio is stream / old, goal <= 1.01.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_rng_stream.py [--rounds 9] [--steps 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import torch

import gpu_training.step as step_module
from gpu_training.config import TrainingConfig
from gpu_training.data import GlobalBatchSampler
from gpu_training.ddp import DistributedContext
from gpu_training.rng import micro_batch_rng
from gpu_training.strategy import prepare
from gpu_training.tasks.charlm import CharLMConfig, CharTransformer, build_datasets, loss_fn

GOAL = 1.01
SHAPES = {
    "demo (4 layers, width 128, T 64, B 16, A 2)": (
        CharLMConfig(block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.1),
        16,
        2,
    ),
    "tiny (1 layer, width 32, T 32, B 4, A 2)": (
        CharLMConfig(block_size=32, n_layer=1, n_head=2, n_embd=32, dropout=0.1),
        4,
        2,
    ),
}


@contextlib.contextmanager
def _no_stream(*_: Any, **__: Any) -> Iterator[None]:
    yield


def _time_steps(
    shape: CharLMConfig, per_device: int, accum: int, steps: int, stream: bool
) -> float:
    """Seconds per optimizer step over ``steps`` steps (after one warm-up step)."""
    ctx = DistributedContext()
    data = build_datasets(block_size=shape.block_size)
    torch.manual_seed(0)
    model = CharTransformer(shape, data.tokenizer.vocab_size)
    cfg = TrainingConfig(
        per_device_batch_size=per_device,
        gradient_accumulation_steps=accum,
        precision="fp32",
        learning_rate=1e-3,
    )
    run = prepare(model, "none", ctx, cfg, device="cpu")
    sampler = GlobalBatchSampler(len(data.train), per_device * accum, per_device, ctx, seed=0)
    loader = torch.utils.data.DataLoader(data.train, batch_sampler=sampler)
    groups = list(zip(range(steps + 1), step_module.step_batches(loader, accum), strict=False))
    step_module.micro_batch_rng = micro_batch_rng if stream else _no_stream
    try:
        started = 0.0
        for step, batches in groups:
            if step == 1:
                started = time.perf_counter()
            norm, _ = step_module.train_step(
                batches,
                run.model,
                loss_fn,
                run.steps,
                ctx=ctx,
                device=torch.device("cpu"),
                seed=0,
                step=step,
            )
            assert norm is not None
            float(norm)  # the step is done
        return (time.perf_counter() - started) / steps
    finally:
        step_module.micro_batch_rng = micro_batch_rng


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    for name, (shape, per_device, accum) in SHAPES.items():
        times: dict[str, list[float]] = {"old": [], "stream": []}
        for round_ in range(args.rounds):
            order = ("old", "stream") if round_ % 2 == 0 else ("stream", "old")
            for variant in order:
                times[variant].append(
                    _time_steps(shape, per_device, accum, args.steps, variant == "stream")
                )
        old, new = statistics.median(times["old"]), statistics.median(times["stream"])
        rows.append(
            {"shape": name, "old_ms": old * 1e3, "stream_ms": new * 1e3, "ratio": new / old}
        )
    print(
        f"micro-batch random stream, {date.today()}, torch {torch.__version__}, {platform.machine()}"
    )
    print(f"{'shape':<46} {'old ms/step':>12} {'stream ms/step':>15} {'ratio':>7}")
    for row in rows:
        verdict = "met" if row["ratio"] <= GOAL else "MISSED"
        print(
            f"{row['shape']:<46} {row['old_ms']:>12.2f} {row['stream_ms']:>15.2f} "
            f"{row['ratio']:>7.3f}  goal <= {GOAL} {verdict}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
