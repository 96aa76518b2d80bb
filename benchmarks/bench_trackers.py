"""What ``run.trackers`` costs: start-up and per-record time of W&B (offline) and MLflow.

A run sends one record per log step (``run.log_every``) and one per evaluation, each of
about ten values; this times :class:`~gpu_training.reporting.MetricsWriter` doing that with
``metrics.jsonl`` alone, and with each tracker added. Each configuration runs in a fresh
interpreter, so its start-up includes importing the tracker's package (paid once per run,
on rank 0). Figures are medians over the records.

Usage::

    python benchmarks/bench_trackers.py [--records 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

CONFIGS: dict[str, list[str]] = {
    "jsonl": ["jsonl"],
    "jsonl + mlflow (file store)": ["jsonl", "mlflow"],
    "jsonl + wandb (offline)": ["jsonl", "wandb"],
}
_VALUES = {
    "loss": 2.5,
    "lr": 1e-3,
    "grad_norm": 0.9,
    "skipped_steps": 0.0,
    "samples_per_s": 400.0,
    "tokens_per_s": 6400.0,
    "global_samples_per_s": 400.0,
    "global_tokens_per_s": 6400.0,
    "tflops_per_gpu": 0.1,
    "mfu": 0.4,
}


def measure(trackers: list[str], records: int) -> dict[str, float]:
    """Start, per-record and close seconds of one writer (in this process)."""
    from gpu_training.job import TrackerSpec
    from gpu_training.reporting import MetricsWriter

    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        writer = MetricsWriter(
            out,
            tensorboard=False,
            resume_step=0,
            trackers=[TrackerSpec(name) for name in trackers],
            params={"job": {"training": {"learning_rate": 1e-3}}, "environment": {}},
        )
        start_s = time.perf_counter() - started
        assert set(writer.run_ids) == set(trackers) - {"jsonl"}, "a tracker did not start"
        times = []
        for step in range(1, records + 1):
            started = time.perf_counter()
            writer.write("train", step, _VALUES)
            times.append(time.perf_counter() - started)
        started = time.perf_counter()
        writer.close()
        close_s = time.perf_counter() - started
    return {"start_s": start_s, "record_ms": 1000 * statistics.median(times), "close_s": close_s}


def main() -> None:
    """Run every configuration in a fresh interpreter and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child's configuration
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(CONFIGS[args.one], args.records)))
        return
    rows: list[dict[str, Any]] = []
    for name in CONFIGS:
        proc = subprocess.run(
            [sys.executable, __file__, "--one", name, "--records", str(args.records)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append({"trackers": name, **json.loads(proc.stdout.strip().splitlines()[-1])})
    print(f"trackers, {date.today()}, python {platform.python_version()}, {platform.machine()}")
    print(f"{'trackers':<30} {'start s':>8} {'ms/record':>10} {'close s':>8}")
    for row in rows:
        print(
            f"{row['trackers']:<30} {row['start_s']:>8.2f} {row['record_ms']:>10.3f} "
            f"{row['close_s']:>8.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
