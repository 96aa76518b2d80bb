"""Start-up time: ``gpu-training --help`` and ``import gpu_training`` against ``import torch``.

A command-line tool that takes seconds to print its help is one people stop using. The CLI
imports torch only inside the subcommands that need it; this measures that it stays so.
Each command runs in a fresh interpreter, interleaved (a round runs every command once, in a
rotated order), after one untimed warm-up round that fills the page cache; figures are
medians.

``--jobs`` adds a whole 2-rank job of 2 tiny steps (start, rendezvous, steps, checkpoint,
exit), started two ways: ``gpu-training train --nproc 2``, which runs torchrun's agent in its
own process, and ``gpu-training launch --nproc 2`` with the same job file, which starts a
torchrun child as before (the same checks first, the same ``train`` in each rank): the
baseline, measured in the same run.

Usage::

    python benchmarks/bench_startup.py [--runs 15] [--jobs] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_HELP_S = 0.5
COMMANDS: dict[str, list[str]] = {
    "python (nothing)": [sys.executable, "-c", "pass"],
    "import torch": [sys.executable, "-c", "import torch"],
    "import gpu_training": [sys.executable, "-c", "import gpu_training"],
    "gpu-training --help": [sys.executable, "-m", "gpu_training", "--help"],
    "gpu-training --version": [sys.executable, "-m", "gpu_training", "--version"],
}


JOBS: dict[str, list[str]] = {
    "train --nproc 2 (a job)": ["train", "{job}", "--nproc", "2"],
    "launch --nproc 2 (a job)": ["launch", "--nproc", "2", "{job}"],
}
"""A 2-step job started two ways: the agent in ``train``'s process, or a torchrun child."""


def _job_file(root: Path) -> Path:
    """A tiny built-in job (fp32, 2 steps, one checkpoint, no plot or trackers) under ``root``."""
    text = f"""task: charlm
task_options: {{block_size: 32, n_layer: 1, n_head: 2, n_embd: 32}}
training: {{global_batch_size: 8, per_device_batch_size: 4, max_steps: 2, warmup_steps: 1,
  precision: fp32}}
strategy: {{name: ddp}}
checkpoint: {{every: 2}}
run: {{output_dir: {root / "out"}, log_every: 1, eval_every: 2, eval_batches: 1,
  progress: false, plot: false, tensorboard: false, trackers: [jsonl]}}
"""
    path = root / "job.yaml"
    path.write_text(text)
    return path


def job_command(name: str, root: Path) -> list[str]:
    """The argv of job ``name`` with a fresh output directory (a used one would resume)."""
    run_dir = Path(tempfile.mkdtemp(dir=root))
    job = str(_job_file(run_dir))
    return [sys.executable, "-m", "gpu_training", *(a.format(job=job) for a in JOBS[name])]


def time_once(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds from spawn to exit; raises if the command fails."""
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-800:]}")
    return elapsed


def measure(runs: int, jobs: bool = False) -> dict[str, list[float]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    names = list(COMMANDS) + (list(JOBS) if jobs else [])
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:

        def argv(name: str) -> list[str]:
            return COMMANDS[name] if name in COMMANDS else job_command(name, Path(tmp))

        for name in names:  # warm-up: page cache, .pyc files
            time_once(argv(name), env)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(runs):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(time_once(argv(name), env))
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="interleaved rounds (>= 3)")
    parser.add_argument(
        "--jobs", action="store_true", help="also a 2-rank job: train --nproc 2 vs launch"
    )
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/startup.json")
    args = parser.parse_args(argv)
    if args.runs < 3:
        parser.error("--runs must be >= 3")
    load_before = os.getloadavg()
    samples = measure(args.runs, jobs=args.jobs)
    load_after = os.getloadavg()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    torch_s = medians["import torch"]
    print(
        f"{args.runs} interleaved rounds, medians; Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} -> {load_after[0]:.1f}"
    )
    print(f"{'command':<26}{'median s':>10}{'min s':>9}{'vs import torch':>17}")
    for name, values in samples.items():
        print(
            f"{name:<26}{medians[name]:>10.3f}{min(values):>9.3f}{medians[name] / torch_s:>16.2f}x"
        )
    if args.jobs:
        here, child = (medians[name] for name in JOBS)
        print(f"a 2-rank job: train --nproc 2 / launch --nproc 2 = {here / child:.3f}")
    help_s = medians["gpu-training --help"]
    verdict = "met" if help_s < GOAL_HELP_S else "MISSED"
    print(f"goal gpu-training --help < {GOAL_HELP_S} s: {verdict} ({help_s:.3f} s)")
    result = {
        "benchmark": "startup",
        "date": date.today().isoformat(),
        "runs": args.runs,
        "median_s": {k: round(v, 4) for k, v in medians.items()},
        "samples_s": {k: [round(x, 4) for x in v] for k, v in samples.items()},
        "goal_help_s": GOAL_HELP_S,
        "goal_met": help_s < GOAL_HELP_S,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1min": [round(load_before[0], 2), round(load_after[0], 2)],
        },
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
