"""Batch-size finder: probes used and result accuracy, for every true limit b* from 1 to 5000.

A synthetic ``fits(b) = b <= b*`` stands for "a training step at batch b fits in memory".
For each b* the finder runs with ``max_batch`` = 8192 and ``safety_margin`` = 0.85; the
figures are how many times it called ``fits`` (against the bound ``2⌈log₂ b*⌉ + 2``) and how
far its recommendation is from ``floor(0.85 · b*)``. No GPU and no timing: the figures are
exact and the same on every machine, so they go into the benchmark JSON as a regression guard.

Usage::

    python benchmarks/bench_batch_finder.py [--max-limit 5000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # runs from a checkout without an install

from gpu_training.profiling import search_max_batch_size  # noqa: E402

MARGIN = 0.85
CEILING = 8192


def probe_bound(limit: int) -> int:
    """The issue's budget of probes for a true limit ``limit``."""
    return 2 * math.ceil(math.log2(limit)) + 2 if limit > 1 else 2


def fits_up_to(limit: int) -> Callable[[int], bool]:
    """A ``fits`` probe for a device that holds batches up to ``limit``."""
    return lambda batch: batch <= limit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-limit", type=int, default=5000)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/batch_finder.json")
    args = parser.parse_args(argv)
    probes: list[int] = []
    over_budget: list[int] = []
    errors: list[int] = []
    for limit in range(1, args.max_limit + 1):
        result = search_max_batch_size(fits_up_to(limit), 1, CEILING, MARGIN)
        probes.append(result.num_probes)
        if result.num_probes > probe_bound(limit):
            over_budget.append(limit)
        errors.append(result.recommended - max(1, math.floor(MARGIN * limit)))
    worst = max(range(len(probes)), key=lambda i: probes[i] / probe_bound(i + 1))
    summary = {
        "benchmark": "batch_finder",
        "date": date.today().isoformat(),
        "limits": [1, args.max_limit],
        "max_batch": CEILING,
        "safety_margin": MARGIN,
        "probes_median": statistics.median(probes),
        "probes_max": max(probes),
        "worst_probes_vs_bound": [worst + 1, probes[worst], probe_bound(worst + 1)],
        "limits_over_budget": over_budget,
        "max_abs_error_batches": max(abs(e) for e in errors),
    }
    print(
        f"b* = 1..{args.max_limit}, max_batch {CEILING}, margin {MARGIN}: "
        f"median {summary['probes_median']:.0f} probes, max {summary['probes_max']}; "
        f"worst vs 2*ceil(log2 b*)+2: b*={worst + 1} used {probes[worst]} of "
        f"{probe_bound(worst + 1)}; over budget: {len(over_budget)}; "
        f"largest distance from floor({MARGIN}*b*): {summary['max_abs_error_batches']} batch(es)"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 1 if over_budget else 0


if __name__ == "__main__":
    raise SystemExit(main())
