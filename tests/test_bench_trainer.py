"""Tests for benchmarks/bench_trainer.py: the quick run completes and its JSON is whole.

Only the shape and sanity of the figures are checked (finite, positive, one per repetition),
never the goals: no test depends on absolute times.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import pytest

from bench_scripts import load_benchmark
from dist_harness import REPO_ROOT, run_python

SCRIPT = REPO_ROOT / "benchmarks" / "bench_trainer.py"


def _load_bench() -> ModuleType:
    return load_benchmark("bench_trainer")


def test_step_clock_excludes_warmup_and_later_calls() -> None:
    bench = _load_bench()
    clock = bench.StepClock(lambda outputs, targets: outputs.sum())
    clock.times = [0.0, 5.0, 6.0, 8.0, 10.0, 99.0]  # 5 steps, then an evaluation call
    assert clock.step_seconds(steps=5, warmup=1) == pytest.approx((10.0 - 5.0) / 3)
    with pytest.raises(RuntimeError, match="expected 7 training steps"):
        clock.step_seconds(steps=7, warmup=1)


@pytest.mark.multirank
@pytest.mark.timeout(150)
@pytest.mark.slow
def test_quick_run_writes_every_row(tmp_path: Path) -> None:
    out = tmp_path / "trainer.json"
    proc = run_python([str(SCRIPT), "--quick", "--json", str(out)], timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "ratio" in proc.stdout and "goal" in proc.stdout
    result = json.loads(out.read_text())
    assert result["benchmark"] == "trainer" and result["quick"] is True
    reps = result["reps"]
    assert reps == 2
    rows = {(row["model"], row["ranks"]): row for row in result["rows"]}
    assert set(rows) == {("charlm", 1), ("charlm", 2), ("mlp", 1), ("mlp", 2)}
    for key, row in rows.items():
        for name in ("trainer_ms", "manual_ms", "ratio", "ratio_of_fastest", "goal"):
            value = row[name]
            assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (
                key,
                name,
                value,
            )
        assert row["goal"] == (1.03 if row["model"] == "charlm" else 1.10)
        assert row["ratio"] == pytest.approx(row["trainer_ms"] / row["manual_ms"], rel=1e-3)
        assert list(row["kinds"]) == result["kinds"]
        assert {"trainer", "helpers", "manual"} <= set(result["kinds"])
        for kind in result["kinds"]:
            samples = row["samples_ms"][kind]
            assert len(samples) == reps
            assert all(math.isfinite(x) and x > 0 for x in samples), (key, kind, samples)
            fig = row["kinds"][kind]
            assert fig["ratio"] == pytest.approx(fig["ms"] / row["manual_ms"], rel=1e-3)
    assert all(len(v) == 2 for v in [result["machine"]["load_average_1min"]])
