"""``verify`` on masked targets compares like with like: the Trainer's normalization, both sides.

Issue 30: on instruction data (prompt targets -100) every rank's micro-batch scores a different
number of targets, so a per-micro-batch mean is not the whole batch's mean and ``verify`` raised
``FAIL grad_sync`` / ``FAIL accumulation`` on a correct job. A ``(sum, count)`` loss is now
divided by the scored targets of the whole batch on the ranks and in the reference, as
:func:`gpu_training.step.train_step` does; a mean loss is compared as before.

- in one process (fast): the report names the normalization it checked; a mean loss still
  passes where it should, and fails — with the reason — on masked targets, where its gradient
  does depend on the split; a loss whose counts are not the task's is bad input;
- on 2 ranks through the command line: the shipped ``configs/hf/finetune_fsdp.yaml`` with the
  shipped ``instructions.jsonl`` (``model_dir`` pointed at a tiny saved Llama) passes, and the
  same job with an accumulation loop that leaves ``no_sync`` on still fails.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import masked_task
from dist_harness import REPO_ROOT, run_python
from gpu_training.ddp import DistributedContext, gradient_sync
from gpu_training.diagnostics.verify import VerifyInputError, VerifyReport, verify_setup
from gpu_training.tasks import cross_entropy_loss, cross_entropy_sum
from test_verify import plain_model, regression_data

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
JOB = REPO_ROOT / "configs" / "hf" / "finetune_fsdp.yaml"
SUMMED = "(sum, count), normalized over the scored targets of the whole batch"
MEAN = "mean per micro-batch"


def sync_left_off(model: nn.Module, micro_batches: Any, loss_fn: Any) -> None:
    """A planted bug: the window runs under ``no_sync`` to the end, the all-reduce never runs."""
    with gradient_sync(model, enabled=False):
        for inputs, targets in micro_batches:
            (loss_fn(model(inputs), targets) / len(micro_batches)).backward()


def _miscounted(outputs: Any, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum, count)`` counting every position, scored or not (the Trainer refuses it)."""
    total, _ = cross_entropy_sum(outputs, targets)
    return total, torch.tensor(targets.numel())


# --- one process --------------------------------------------------------------------------


def test_a_mean_loss_is_checked_as_a_mean_and_the_report_says_so() -> None:
    data, _ = regression_data()
    report = verify_setup(plain_model, data, nn.functional.mse_loss, DistributedContext())
    assert report.passed, report.format()
    assert report.loss.startswith(MEAN), report.loss
    assert f"\nloss: {MEAN}" in report.format()
    assert "scored targets" not in report["accumulation"].detail, report["accumulation"].detail
    again = VerifyReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report and again.loss == report.loss


def test_masked_targets_pass_as_sum_count_and_fail_as_a_mean() -> None:
    """The window's 2 micro-batches score different numbers of targets (masked_task)."""
    train, _ = masked_task.data()
    ctx = DistributedContext()
    summed = verify_setup(masked_task.model, train, cross_entropy_sum, ctx, accum_steps=2)
    assert summed.passed, summed.format()
    assert summed.loss.startswith(SUMMED), summed.loss
    assert f"\nloss: {SUMMED}" in summed.format()
    assert "scored targets)" in summed["accumulation"].detail, summed["accumulation"].detail

    # A mean per micro-batch over masked targets weighs a target by 1/(its micro-batch's
    # count): the Trainer's result depends on the split, and verify says so.
    mean = verify_setup(masked_task.model, train, cross_entropy_loss, ctx, accum_steps=2)
    assert mean.loss.startswith(MEAN), mean.loss
    assert [c.name for c in mean.checks if not c.passed] == ["accumulation"], mean.format()
    detail = mean["accumulation"].detail
    assert "the loss is a mean per micro-batch and the micro-batches score" in detail, detail
    assert "return (sum, count)" in detail, detail


def test_a_loss_counting_other_targets_than_the_task_is_bad_input() -> None:
    train, _ = masked_task.data()
    with pytest.raises(VerifyInputError, match=r"rank 0: the loss returned a count of \d+ scored"):
        verify_setup(masked_task.model, train, _miscounted, DistributedContext())


# --- the shipped instruction job on 2 ranks -----------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama saved with ``save_pretrained`` and its tokenizer (no training)."""
    import hf_runs as H

    return Path(H.make_assets(tmp_path_factory.mktemp("verify_masked") / "assets")["base"])


def _verify_job(model_dir: Path, tmp_path: Path, *more: str) -> Any:
    """``gpu-training verify --config`` the shipped job, its model and cache redirected."""
    (tmp_path / "tmp").mkdir()
    return run_python(
        [
            "-m",
            "gpu_training",
            "verify",
            "--config",
            str(JOB.relative_to(REPO_ROOT)),
            "--set",
            f"task_options.model_dir={model_dir}",
            "--set",
            f"task_options.cache_dir={tmp_path / 'cache'}",
            "--nproc",
            "2",
            "--seed",  # the ranks' first micro-batches score different numbers of targets
            "1",
            *more,
        ],
        timeout=240,
        cwd=REPO_ROOT,  # the job's train_files are relative to the repository root
        env={"TMPDIR": str(tmp_path / "tmp")},
    )


@pytest.mark.multirank
@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed (the hf extra)")
def test_the_shipped_instruction_job_passes(model_dir: Path, tmp_path: Path) -> None:
    proc = _verify_job(model_dir, tmp_path, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    report = VerifyReport.from_dict(json.loads(proc.stdout))
    assert report.passed and report["grad_sync"].passed and report["accumulation"].passed
    assert report.loss.startswith(SUMMED), report.loss
    assert "scored targets)" in report["grad_sync"].detail, report["grad_sync"].detail
    assert "scored targets)" in report["accumulation"].detail, report["accumulation"].detail


@pytest.mark.multirank
@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed (the hf extra)")
def test_a_planted_sync_bug_on_the_instruction_job_still_fails(
    model_dir: Path, tmp_path: Path
) -> None:
    proc = _verify_job(model_dir, tmp_path, "--step", "test_verify_masked:sync_left_off")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[1].startswith(f"loss: {SUMMED}"), proc.stdout
    assert any(line.startswith("PASS  grad_sync") for line in lines), proc.stdout
    failed = [line for line in lines if line.startswith("FAIL  accumulation")]
    assert failed and "gradient != the 16-sample batch's (" in failed[0], proc.stdout
    assert lines[-1] == "6 of 7 checks passed; failed: accumulation", proc.stdout
