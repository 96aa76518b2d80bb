"""Tests for benchmarks/bench_loops.py: every loop runs in-process, the table's arithmetic.

No test depends on a time: the loops are run for their steps and their clocks, the summary
on records written here.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

from bench_scripts import load_benchmark
from dist_harness import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "bench_loops.py"


def _load() -> ModuleType:
    return load_benchmark("bench_loops")  # it imports bench_trainer beside it


@pytest.mark.parametrize(
    "kind", ["plain", "helper", "train_one_epoch", "trainer", "trainer_no_telemetry"]
)
def test_every_loop_trains_the_planned_steps_in_one_process(kind: str) -> None:
    bench = _load()
    plan = bench.Plan(steps=6, warmup=2, global_batch=8, log_every=3)
    task = bench.mlp_task(plan.global_batch * (plan.steps + 1))
    clock = bench.RUNNERS[kind](task, plan, 1)
    assert len(clock.times) == plan.steps  # one loss call per step, no more
    wall, cpu = clock.timing(plan.steps, plan.warmup)
    assert wall > 0 and cpu > 0


def test_the_loops_start_from_the_same_weights_and_train_the_same_first_step() -> None:
    """Same model, data and optimizer: after one step the plain loop and the helper loop
    agree (the helpers add no math of their own)."""
    bench = _load()
    plan = bench.Plan(steps=1, warmup=0, global_batch=8, log_every=1)
    task = bench.mlp_task(64)
    weights = []
    for kind in ("plain", "helper"):
        captured: list[torch.Tensor] = []
        build = task.build_model

        def keep(build: Any = build, captured: list[torch.Tensor] = captured) -> Any:
            model = build()
            captured.append(model[0].weight)
            return model

        torch.manual_seed(0)
        bench.RUNNERS[kind](bench.replace(task, build_model=keep), plan, 1)
        weights.append(captured[0].detach().clone())
    # The shuffles draw from the same seed: the same 8 samples, the same update.
    torch.testing.assert_close(weights[0], weights[1])


def _records(ratios: dict[str, list[float]], foreign: list[float]) -> list[dict[str, Any]]:
    out = []
    for index, load in enumerate(foreign):
        for workload in ("transformer", "mlp"):
            for kind, per_round in ratios.items():
                out.append(
                    {
                        "round": index,
                        "workload": workload,
                        "kind": kind,
                        "step_s": per_round[index],
                        "step_cpu_s": per_round[index],
                        "foreign_cores": load if kind == "helper" else 0.0,
                    }
                )
    return out


def test_ratios_are_taken_within_rounds_and_loaded_rounds_are_left_out() -> None:
    bench = _load()
    # plain drifts 1 -> 3 across rounds; helper is always 2 % slower in its own round.
    plain = [1.0, 2.0, 3.0, 1.5, 2.5]
    ratios = {"plain": plain, "helper": [p * 1.02 for p in plain], "train_one_epoch": plain}
    ratios["trainer"] = plain
    run = {"kinds": list(ratios), "records": _records(ratios, [0.0, 0.0, 0.9, 0.0, 0.0])}
    rows = bench.summarise(2, run, max_foreign=0.25)
    helper = next(r for r in rows if r["kind"] == "helper" and r["workload"] == "mlp")
    assert helper["ratio"] == pytest.approx(1.02)
    assert helper["rounds"] == 4 and helper["rounds_left_out"] == 1  # round 2 was loaded
    assert helper["foreign_cores_max"] == pytest.approx(0.9)
    lines = bench.verdicts(rows + bench.summarise(1, run, max_foreign=0.25))
    assert any("mlp" in line and "helper" in line and "met" in line for line in lines)
