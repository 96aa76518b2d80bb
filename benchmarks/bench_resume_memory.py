"""Peak memory per rank while ``train`` resumes a checkpoint under another strategy.

Issue 31: no rank may hold the whole optimizer state unless the target layout does. This
writes a checkpoint of a ~25M-parameter character transformer (AdamW: weights, two moments)
with DDP, FSDP2, DeepSpeed ZeRO-2 and ZeRO-3 on 2 ranks, then resumes each under other
strategies on 2 ranks at its last step (nothing left to train: the load is all that runs)
and reports, per rank, the peak of private memory (``RssAnon``, sampled every 2 ms) and
``VmHWM`` (which also counts file pages mapped in: a plain ``state.pt`` or DeepSpeed's files
read through ``mmap``).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_resume_memory.py [--width 512] [--layers 8]
    OMP_NUM_THREADS=1 python benchmarks/bench_resume_memory.py --pairs zero2:fsdp,ddp:zero3

The ranks come from the test suite's harness (``tests/dist_harness.py``), which forks them
from one interpreter that imported torch and the package.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "benchmarks")]

PAIRS: tuple[tuple[str, str], ...] = (
    ("fsdp", "fsdp"),
    ("ddp", "fsdp"),
    ("ddp", "ddp"),
    ("fsdp", "ddp"),
    ("zero2", "zero2"),  # DeepSpeed's own load: the baseline of the ZeRO rows
    ("zero3", "zero3"),
    ("zero2", "zero3"),
    ("zero2", "fsdp"),
    ("ddp", "zero3"),
    ("fsdp", "zero3"),
    ("zero3", "fsdp"),
    ("zero2", "ddp"),
)
"""(written by, resumed by): ``zero2`` and ``zero3`` are DeepSpeed's stages."""


def _strategy(name: str) -> dict[str, Any]:
    if name.startswith("zero"):
        return {"name": "deepspeed", "zero_stage": int(name[4:])}
    return {"name": name}


def _status() -> dict[str, int]:
    """This process's memory figures from ``/proc/self/status``, in MiB."""
    out = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) // 1024
    return out


def resume_rank(argv: list[str]) -> dict[str, int]:
    """One rank of ``gpu-training ARGV`` with its private memory sampled (a rank function)."""
    from gpu_training.cli import main

    peak = {"anon": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak["anon"] = max(peak["anon"], _status()["RssAnon"])
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = main(argv)
    stop.set()
    sampler.join()
    if code != 0:
        raise SystemExit(code)
    return {"peak_anon": peak["anon"], **_status()}


def _job(out: Path, strategy: str, width: int, layers: int) -> Path:
    import yaml

    job: dict[str, Any] = {
        "task": "charlm",
        "task_options": {
            "block_size": 32,
            "n_layer": layers,
            "n_head": 8,
            "n_embd": width,
            "bias": False,
        },
        "training": {
            "global_batch_size": 4,
            "per_device_batch_size": 2,
            "max_steps": 2,
            "precision": "fp32",
            "seed": 0,
        },
        "strategy": _strategy(strategy),
        "checkpoint": {"every": 2, "keep_last_n": 2},
        "run": {
            "output_dir": str(out),
            "eval_every": 1000,
            "eval_batches": 1,
            "plot": False,
            "tensorboard": False,
            "progress": False,
        },
    }
    path = out.parent / f"{out.name}-{strategy}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument(
        "--pairs", help="FROM:TO,... of the pairs to run (default: all of PAIRS)", default=None
    )
    args = parser.parse_args()
    pairs: list[tuple[str, str]] = list(PAIRS)
    if args.pairs:
        pairs = [(pair.split(":")[0], pair.split(":")[1]) for pair in args.pairs.split(",")]

    from bench_resume_memory import resume_rank  # the harness runs a module's function

    from dist_harness import run_ranks
    from train_jobs import train

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-resume-memory-") as tmp:
        written = {}
        for strategy in sorted({source for source, _ in pairs}):
            out = Path(tmp) / strategy
            train(_job(out, strategy, args.width, args.layers), 2, timeout=900)
            step = out / "checkpoints" / "step-00000002"
            size = sum(f.stat().st_size for f in step.iterdir()) / 2**20
            print(f"checkpoint written by {strategy} on 2 ranks: {size:.0f} MiB", flush=True)
            written[strategy] = out
        for source, target in pairs:
            out = Path(tmp) / f"{source}-to-{target}"
            shutil.copytree(written[source], out)
            job = _job(out, target, args.width, args.layers)
            ranks = run_ranks(resume_rank, 2, args=(["train", str(job)],), timeout=900)
            for rank, figures in enumerate(ranks):
                rows.append({"from": source, "to": target, "rank": rank, **figures})
                print(
                    f"{source} -> {target} rank {rank}: peak RssAnon {figures['peak_anon']} MiB,"
                    f" VmHWM {figures['VmHWM']} MiB (after: RssAnon {figures['RssAnon']},"
                    f" RssFile {figures['RssFile']})",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
