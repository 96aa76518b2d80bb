"""``verify`` on a tensor-parallel job: the four TP checks pass on the real 2-D wrap and each
one fails on a planted bug (issue 34).

One 2-rank gloo run (TP 2, one data-parallel replica) of tests/tp_jobs.py's model (dropout,
in ``eval()`` mode) on masked_task's data with a ``(sum, count)`` loss runs
:func:`check_tensor_parallel` four times in the same process group:

- the job's own plan: every check passes;
- the TP ranks each read their own samples (the data-parallel view replaced by the world's):
  ``tp_data`` and ``tp_grads`` fail;
- a plan (as code) that splits the MLPs, then perturbs the final norm, which it leaves whole,
  on rank 1: ``tp_replicated`` fails;
- a plan that splits the MLPs, then writes the same values into every rank's slice:
  ``tp_sharded`` fails.

Bad input (``tensor_parallel`` not dividing ``--nproc``) is one line, exit 2, before any
process starts.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch import nn

import tp_jobs
from dist_harness import run_python, run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(180)]

TP2 = {"name": "fsdp", "tensor_parallel": 2, "block_classes": ["Block"]}


def perturb_replicated(model: nn.Module, tp_mesh: Any) -> None:
    """``tp_plan`` as code: the MLPs split, then the whole ``ln_f`` nudged on TP rank 1."""
    tp_jobs.mlp_plan(model, tp_mesh)
    with torch.no_grad():
        model.get_parameter("ln_f.weight").add_(1e-3 * tp_mesh.get_local_rank())


def duplicate_shards(model: nn.Module, tp_mesh: Any) -> None:
    """``tp_plan`` as code: the MLPs split, then every rank's slice of ``c_fc`` made equal."""
    tp_jobs.mlp_plan(model, tp_mesh)
    with torch.no_grad():
        weight: Any = model.get_parameter("blocks.0.mlp.c_fc.weight")
        weight.to_local().fill_(0.01)


def _worker() -> dict[str, dict[str, bool]]:
    import gpu_training.strategy.tensor_parallel as tensor_parallel
    import masked_task
    from gpu_training.ddp import cleanup_distributed, init_distributed
    from gpu_training.diagnostics.verify.plan import VerifyPlan
    from gpu_training.diagnostics.verify.tp_checks import check_tensor_parallel
    from gpu_training.strategy.spec import StrategyConfig
    from gpu_training.tasks import cross_entropy_sum

    ctx = init_distributed(backend="gloo")
    try:
        train, _ = masked_task.data()
        plan = VerifyPlan(train, cross_entropy_sum, ctx, torch.device("cpu"), 4, 1, 1e-4, 1e-6, 0)
        out: dict[str, dict[str, bool]] = {}

        def run(name: str, **fields: Any) -> None:
            spec = StrategyConfig(**{**TP2, **fields})
            checks = check_tensor_parallel(tp_jobs.model, plan, spec)
            if ctx.is_main_process:
                print(name, *(f"{c.name}: {c.passed} {c.detail}" for c in checks), sep="\n  ")
            out[name] = {c.name: c.passed for c in checks}

        run("real")
        real_view = tensor_parallel.data_parallel_context
        tensor_parallel.data_parallel_context = lambda c, tp: c  # type: ignore[assignment]
        run("wrong_data")
        tensor_parallel.data_parallel_context = real_view
        run("perturbed", tp_plan="test_verify_tp:perturb_replicated")
        run("duplicated", tp_plan="test_verify_tp:duplicate_shards")
        return out
    finally:
        cleanup_distributed()


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict[str, bool]]:
    results = run_ranks(_worker, 2, timeout=150)
    assert results[0] == results[1]
    return results[0]


def test_the_real_2d_wrap_passes_every_tp_check(verdicts: dict[str, dict[str, bool]]) -> None:
    assert verdicts["real"] == dict.fromkeys(
        ("tp_data", "tp_grads", "tp_replicated", "tp_sharded"), True
    )


def test_a_tp_group_fed_different_samples_fails_data_and_grads(
    verdicts: dict[str, dict[str, bool]],
) -> None:
    assert not verdicts["wrong_data"]["tp_data"]
    assert not verdicts["wrong_data"]["tp_grads"]


def test_a_replicated_parameter_perturbed_per_rank_fails(
    verdicts: dict[str, dict[str, bool]],
) -> None:
    assert not verdicts["perturbed"]["tp_replicated"]
    assert verdicts["perturbed"]["tp_sharded"] and verdicts["perturbed"]["tp_data"]


def test_identical_slices_fail_the_sharded_check(verdicts: dict[str, dict[str, bool]]) -> None:
    assert not verdicts["duplicated"]["tp_sharded"]
    assert verdicts["duplicated"]["tp_replicated"]


def test_a_degree_that_does_not_divide_nproc_is_one_line_exit_2(tmp_path: Any) -> None:
    job = tp_jobs.job_file(tmp_path, "tp3", {**TP2, "tensor_parallel": 3})
    proc = run_python(
        ["-m", "gpu_training", "verify", "--config", str(job), "--nproc", "2"], timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "strategy.tensor_parallel" in err[0], proc.stderr


def test_verify_on_a_tp_job_file_adds_the_tp_checks_and_passes(tmp_path: Any) -> None:
    """Through the command line: the job's strategy turns the TP checks on (torchrun, 2 ranks)."""
    job = tp_jobs.job_file(tmp_path, "tp2", TP2)
    args = ["-m", "gpu_training", "verify", "--config", str(job), "--nproc", "2", "--json"]
    proc = run_python(args, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    names = [c["name"] for c in report["checks"]]
    assert names[-4:] == ["tp_data", "tp_grads", "tp_replicated", "tp_sharded"]
    assert report["passed"]
