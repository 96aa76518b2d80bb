"""benchmarks/bench_tensor_parallel.py: its jobs are valid and its ratio is the ratio of medians
(the figures themselves come from running it: benchmarks/README.md)."""

from __future__ import annotations

import sys

import pytest

from dist_harness import REPO_ROOT
from gpu_training.job import JobConfig

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import bench_tensor_parallel as bench


@pytest.mark.parametrize(("world", "tp"), [(2, 1), (2, 2), (4, 2)])
def test_both_layouts_are_valid_jobs_with_the_same_global_batch(world: int, tp: int) -> None:
    job = JobConfig.from_dict(bench.job_dict(bench.Plan(), world, tp, "/tmp/unused"))
    assert job.strategy.name == "fsdp" and job.strategy.tensor_parallel == tp
    replicas = world // tp
    assert job.training.per_device_batch_size * replicas == job.training.global_batch_size


def test_the_ratio_is_2d_over_fsdp_of_the_medians() -> None:
    times = {
        "fsdp": [[1.0, 2.0], [3.0, 4.0], [2.0, 3.0]],
        "tp": [[4.0, 4.0], [6.0, 9.0], [5.0, 6.0]],
    }
    row = bench.summarise(times, 2, "gloo")
    assert row["ratio"] == pytest.approx(5.0 / 2.0)
    assert row["cpu_ratio"] == pytest.approx(6.0 / 3.0)
    assert row["layout"] == "1 x TP 2" and row["reps"] == 3
