"""The Trainer's performance path: compile switch, TF32 policy, tokens/s and MFU, async norms.

The CPU tests check the wiring in one process (fast); the GPU tier compiles for real.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gpu_training.amp import MixedPrecisionTrainer
from gpu_training.config import ConfigError
from gpu_training.job import JobConfig
from gpu_training.trainer import Trainer

SHAPE = {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 32}


def _job(tmp_path: Path, strategy: str = "none", **run: Any) -> JobConfig:
    return JobConfig.from_dict(
        {
            "task": "charlm",
            "task_options": SHAPE,
            "training": {
                "global_batch_size": 8,
                "per_device_batch_size": 4,
                "max_steps": 4,
                "learning_rate": 3e-3,
                "precision": "fp32",
            },
            "strategy": {"name": strategy},
            "run": {
                "output_dir": str(tmp_path),
                "progress": False,
                "log_every": 2,
                "eval_every": 4,
                "eval_batches": 1,
                "plot": False,
                "tensorboard": False,
                **run,
            },
        }
    )


def _train_rows(out: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("split") == "train"]


@pytest.mark.parametrize(("strategy", "compiled"), [("none", "CharTransformer"), ("fsdp", "Block")])
def test_compile_switch_compiles_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str, compiled: str
) -> None:
    """run.compile: the whole model (none/ddp) or each FSDP unit, in place (keys unchanged)."""
    calls: list[str] = []
    monkeypatch.setattr(
        nn.Module, "compile", lambda self, *a, **k: calls.append(type(self).__name__)
    )
    Trainer(_job(tmp_path, strategy, compile=True), quiet=True).fit()
    expected = [compiled] * (SHAPE["n_layer"] if compiled == "Block" else 1)
    assert calls == expected
    calls.clear()
    Trainer(_job(tmp_path / "plain", strategy), quiet=True).fit()
    assert calls == []


def test_log_has_tokens_per_s_and_mfu_against_a_given_peak(tmp_path: Path) -> None:
    Trainer(_job(tmp_path, peak_tflops=0.001), quiet=True).fit()
    rows = _train_rows(tmp_path)
    assert [r["step"] for r in rows] == [2, 4]
    from gpu_training.tasks import resolve_task

    flops = resolve_task("charlm", SHAPE).flops_per_token
    assert flops is not None
    for row in rows:
        assert row["tokens_per_s"] == pytest.approx(row["samples_per_s"] * SHAPE["block_size"])
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * flops / 1e9, rel=1e-9)
        assert math.isfinite(row["grad_norm"]) and row["grad_norm"] > 0


def test_without_a_peak_on_cpu_there_is_no_mfu(tmp_path: Path) -> None:
    Trainer(_job(tmp_path), quiet=True).fit()
    assert all("tokens_per_s" in r and "mfu" not in r for r in _train_rows(tmp_path))


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("compile", "yes", "field 'run.compile': expected true or false"),
        ("tf32", 1, "field 'run.tf32'"),
        ("peak_tflops", -3, "field 'run.peak_tflops': expected a number > 0"),
        ("stall_timeout", 0, "field 'run.stall_timeout': expected a number > 0, got 0"),
        ("stall_timeout", "10s", "field 'run.stall_timeout': expected a number > 0"),
    ],
)
def test_bad_speed_fields_are_named(tmp_path: Path, field: str, value: Any, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        _job(tmp_path, **{field: value})


def test_step_async_matches_step_and_defers_the_read() -> None:
    torch.manual_seed(0)
    models = [nn.Linear(4, 2) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    amps = [MixedPrecisionTrainer(o, "fp32", 1, max_grad_norm=0.5) for o in opts]
    x = torch.randn(8, 4)
    for model, amp in zip(models, amps, strict=True):
        amp.backward(model(x).square().mean())
    norm = amps[0].step(models[0].parameters(), 0)
    handle = amps[1].step_async(models[1].parameters(), 0)
    assert handle is not None and handle.computed  # clipping measured it at the step
    tensor = handle.tensor()
    assert isinstance(tensor, torch.Tensor) and tensor.dim() == 0
    assert norm == pytest.approx(float(tensor))
    assert torch.equal(models[0].weight, models[1].weight)
    assert amps[1].step_async(models[1].parameters(), 0) is not None  # boundary every step
    accum = MixedPrecisionTrainer(torch.optim.SGD(models[0].parameters(), lr=0.1), "fp32", 2)
    assert accum.step_async(models[0].parameters(), 0) is None


@pytest.mark.requires_cuda
@pytest.mark.timeout(300)
def test_compiled_bf16_run_on_cuda_matches_eager(tmp_path: Path) -> None:
    """GPU tier: compile + bf16 + TF32 train, and end near the eager run."""
    import dataclasses

    def job(out: Path, compile_: bool) -> JobConfig:
        base = _job(out, compile=compile_)
        return dataclasses.replace(
            base, training=dataclasses.replace(base.training, precision="bf16", max_steps=20)
        )

    eager = Trainer(job(tmp_path / "eager", False), quiet=True).fit()
    compiled = Trainer(job(tmp_path / "compiled", True), quiet=True).fit()
    assert torch.backends.cuda.matmul.allow_tf32  # mixed precision turns TF32 on
    assert compiled["train_loss"] == pytest.approx(eager["train_loss"], abs=0.05)
    assert compiled["train_loss"] < compiled["first_loss"]


_STALLING_RUN = """
import sys, tempfile, time
import torch
from gpu_training.job import JobConfig
from gpu_training.tasks import resolve_task
from gpu_training.trainer import Trainer
import dataclasses

task = resolve_task("charlm", {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16})
calls = []
def slow_loss(outputs, targets):
    calls.append(1)
    if len(calls) == 3:
        time.sleep(30)  # a rank stuck in its step
    return task.loss_fn(outputs, targets)
job = JobConfig.from_dict({
    "task": "charlm",
    "training": {"global_batch_size": 4, "per_device_batch_size": 4, "max_steps": 6,
                 "precision": "fp32"},
    "strategy": {"name": "none"},
    "run": {"output_dir": sys.argv[1], "progress": False, "plot": False, "tensorboard": False,
            "eval_every": 100, **({"stall_timeout": 2} if sys.argv[2] == "field" else {})},
})
Trainer(job, task=dataclasses.replace(task, loss_fn=slow_loss), quiet=True).fit()
"""


@pytest.mark.serial
@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["field", "env"])
def test_stall_timeout_ends_a_stuck_run_naming_the_step(tmp_path: Path, where: str) -> None:
    """run.stall_timeout (train --stall-timeout), or GPU_TRAINING_STALL_TIMEOUT for a job
    without it: the Trainer ticks the watchdog."""
    import time

    from dist_harness import run_python

    script = tmp_path / "stall.py"
    script.write_text(_STALLING_RUN)
    started = time.monotonic()
    proc = run_python(
        [str(script), str(tmp_path / "out"), where],
        timeout=50,
        env={"GPU_TRAINING_STALL_TIMEOUT": "2"} if where == "env" else None,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 124, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "stalled" in proc.stderr and "step 2" in proc.stderr, proc.stderr[-2000:]
    assert elapsed < 25, f"the watchdog took {elapsed:.0f} s"


@pytest.mark.parametrize(
    ("max_grad_norm", "guard", "measured"), [(None, None, 3), (1.0, None, 6), (None, 5, 3)]
)
def test_trainer_measures_the_norm_only_where_it_is_used(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    max_grad_norm: float | None,
    guard: int | None,
    measured: int,
) -> None:
    """Without clipping only the log steps (2, 4, 6 of 6) measure a norm; clipping measures
    every step's anyway; the non-finite guard does not (its flag is one fused finiteness
    check over the gradients, not a norm); the logged value is the window's mean as before."""
    job = _job(tmp_path, log_every=2)
    data = job.to_dict()
    data["training"].update(max_steps=6, max_grad_norm=max_grad_norm, max_nonfinite_steps=guard)
    job = JobConfig.from_dict(data)
    calls = 0
    real = torch._foreach_norm  # one per measure: torch's get_total_norm's and grad_norm's

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    Trainer(job).fit()
    assert calls == measured
    rows = _train_rows(tmp_path)
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in rows)
