"""GPU tier: skipped on CPU machines, run by `make test-gpu` where CUDA exists."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gpu_training.amp import MixedPrecisionTrainer, resolve_precision
from gpu_training.ddp import DistributedContext, resolve_device
from gpu_training.job import JobConfig
from gpu_training.trainer import Trainer


@pytest.mark.requires_cuda
def test_auto_precision_and_device_on_cuda() -> None:
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert resolve_precision("auto", "cuda") == expected
    assert resolve_device(DistributedContext()) == torch.device("cuda", 0)


@pytest.mark.requires_cuda
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_step_on_cuda_tracks_fp32(precision: str) -> None:
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("GPU without bf16")
    torch.manual_seed(0)
    x, y = torch.randn(64, 32, device="cuda"), torch.randn(64, 8, device="cuda")
    norms = {}
    for p in ("fp32", precision):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).cuda()
        trainer = MixedPrecisionTrainer(
            torch.optim.SGD(model.parameters(), lr=0.1), precision=p, max_grad_norm=1.0
        )
        with trainer.autocast():
            loss = nn.functional.mse_loss(model(x).float(), y)
        trainer.backward(loss)
        norms[p] = trainer.step(model.parameters(), 0)
    assert norms[precision] == pytest.approx(norms["fp32"], rel=2e-2)


def _cuda_job(out: Path, precision: str) -> JobConfig:
    return JobConfig.from_dict(
        {
            "task": "charlm",
            "task_options": {"block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 64},
            "training": {
                "global_batch_size": 16,
                "per_device_batch_size": 8,
                "learning_rate": 3e-3,
                "warmup_steps": 2,
                "max_steps": 8,
                "precision": precision,
                "seed": 7,
            },
            "strategy": {"name": "none"},
            "checkpoint": {"every": 4, "keep_last_n": 2},
            "run": {
                "output_dir": str(out),
                "progress": False,
                "plot": False,
                "tensorboard": False,
                "log_every": 2,
                "eval_every": 100,
                "eval_batches": 1,
            },
        }
    )


def _last_state(out: Path) -> dict[str, Any]:
    last = sorted((out / "checkpoints").glob("step-*"))[-1]
    return torch.load(last / "state.pt", map_location="cpu", weights_only=True)


def _tensors(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {
            k: v for key, sub in tree.items() for k, v in _tensors(sub, f"{prefix}/{key}").items()
        }
    if isinstance(tree, (list, tuple)):
        return {
            k: v for i, sub in enumerate(tree) for k, v in _tensors(sub, f"{prefix}/{i}").items()
        }
    return {}


def _differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    return [k for k in ta if not torch.equal(ta[k], tb[k])]


@pytest.mark.requires_cuda
@pytest.mark.timeout(240)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_run_is_repeatable_and_resumes_bitwise(tmp_path: Path, precision: str) -> None:
    """Promise 2 on a GPU: two fresh runs agree bitwise (no non-deterministic kernel on the
    path), and a run that loses its last checkpoint resumes from step 4 and ends bitwise where
    it did — weights and optimizer state."""
    first, second = tmp_path / "first", tmp_path / "second"
    Trainer(_cuda_job(first, precision), quiet=True).fit()
    Trainer(_cuda_job(second, precision), quiet=True).fit()
    repeat = _differing(_last_state(first)["model_state"], _last_state(second)["model_state"])
    assert not repeat, f"two fresh {precision} CUDA runs differ in {repeat[:5]}"

    uninterrupted = _last_state(first)
    shutil.rmtree(first / "checkpoints" / "step-00000008")
    Trainer(_cuda_job(first, precision), quiet=True).fit()  # resumes from step 4
    resumed = _last_state(first)
    for part in ("model_state", "optimizer_state"):
        changed = _differing(uninterrupted[part], resumed[part])
        assert not changed, f"{precision}: resume differs in {part}: {changed[:5]}"


_CUDA_STALL = """
import sys, time, dataclasses
import torch
from gpu_training.job import JobConfig
from gpu_training.tasks import resolve_task
from gpu_training.trainer import Trainer

task = resolve_task("charlm", {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16})
calls = []
def stuck_on_the_gpu(outputs, targets):
    calls.append(1)
    if len(calls) == 3:
        print(f"STALL_AT {time.time():.3f}", flush=True)
        torch.cuda._sleep(int(25 * 1.0e9))  # a kernel that spins for seconds; the host
        torch.cuda.synchronize()            # then waits for it inside the CUDA driver
    return task.loss_fn(outputs, targets)
job = JobConfig.from_dict({
    "task": "charlm",
    "training": {"global_batch_size": 4, "per_device_batch_size": 4, "max_steps": 6,
                 "precision": "bf16"},
    "strategy": {"name": "none"},
    "run": {"output_dir": sys.argv[1], "progress": False, "plot": False, "tensorboard": False,
            "eval_every": 100, "stall_timeout": 3},
})
Trainer(job, task=dataclasses.replace(task, loss_fn=stuck_on_the_gpu), quiet=True).fit()
"""


@pytest.mark.requires_cuda
@pytest.mark.timeout(120)
def test_watchdog_names_a_rank_stuck_waiting_on_the_gpu(tmp_path: Path) -> None:
    """The host blocked in a CUDA synchronize (a hung kernel, a hung NCCL call) holds no GIL:
    the stall watchdog still fires, names the rank and the frame, and ends the run (124)."""
    import re
    import time

    from dist_harness import run_python

    script = tmp_path / "stall.py"
    script.write_text(_CUDA_STALL)
    proc = run_python([str(script), str(tmp_path / "out")], timeout=100)
    ended = time.time()
    text = proc.stdout + proc.stderr
    assert proc.returncode == 124, text[-3000:]
    assert "stalled" in proc.stderr and "step 2" in proc.stderr, text[-3000:]
    assert "synchronize" in proc.stderr, "the stack dump shows where the rank waits"
    stall_at = float(re.search(r"STALL_AT (\d+\.\d+)", text)[1])  # type: ignore[index]
    print(f"watchdog ended the run {ended - stall_at:.1f} s after the stall")


@pytest.mark.requires_cuda
@pytest.mark.timeout(120)
def test_nccl_group_of_one_all_reduces_through_the_toolkit(tmp_path: Path) -> None:
    """NCCL itself, through the toolkit's init and doctor: a one-rank NCCL group (all one GPU
    allows; NCCL refuses two ranks on one device) joins, all-reduces a CUDA tensor, shows in
    the flight recorder's summary (what the stall watchdog compares) and is torn down; doctor
    reports NCCL's version and the GPU's bf16 support."""
    import json

    from dist_harness import REPO_ROOT, find_free_port, run_python

    script = tmp_path / "nccl.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "from gpu_training import flight_recorder\n"
        "from gpu_training.process_group import cleanup_distributed, collective_device\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'])\n"
        "flight_recorder.enable()\n"
        "torch.cuda.set_device(0)\n"
        "dist.init_process_group('nccl', rank=0, world_size=1)\n"
        "t = torch.full((1024,), 2.0, device=collective_device())\n"
        "dist.all_reduce(t)\n"
        "dist.barrier()\n"
        "print('NCCL_OK', dist.get_backend(), float(t.sum()), torch.cuda.nccl.version())\n"
        "torch.cuda.synchronize()\n"
        "print('FR', flight_recorder.summarize(flight_recorder.snapshot()))\n"
        "cleanup_distributed()\n"
        "print('TORN_DOWN', dist.is_initialized())\n"
    )
    proc = run_python([str(script)], timeout=100, env={"PORT": str(find_free_port())})
    assert "NCCL_OK nccl 2048.0" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "TORN_DOWN False" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    # the flight recorder on NCCL: the all_reduce and the barrier, numbered, in the summary
    seen = next(line for line in proc.stdout.splitlines() if line.startswith("FR "))
    print(seen)
    # NCCL's barrier is an all-reduce: seen on an H200 as {'seq': 2, 'op': 'all_reduce_barrier'}
    assert "'seq': 2" in seen and "barrier" in seen and "'state': 'completed'" in seen, seen
    doctor = run_python(
        ["-m", "gpu_training", "doctor", "--nproc", "1", "--json", "--checkpoint-dir", "."],
        timeout=100,
        cwd=REPO_ROOT,
    )
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    print(json.dumps(checks, indent=1))
    assert not [c for c in checks.values() if c["status"] == "FAIL"], doctor.stdout


def _sync_sites(out: Path, steps: int) -> dict[str, int]:
    """Where a CUDA Trainer run of ``steps`` steps synchronizes the host with the GPU: the
    Python lines torch's sync debug mode warns at, counted. One log, one evaluation, one
    checkpoint, all at the end: only per-step syncs grow with ``steps``."""
    import warnings
    from collections import Counter

    job = _cuda_job(out, "bf16").to_dict()
    job["training"].update(max_steps=steps, max_grad_norm=1.0, max_nonfinite_steps=5)
    job["checkpoint"]["every"] = steps
    job["run"].update(log_every=steps, eval_every=1000, telemetry=True)
    trainer = Trainer(JobConfig.from_dict(job), quiet=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.fit()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return Counter(
        f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)
    )


@pytest.mark.requires_cuda
@pytest.mark.timeout(240)
def test_a_cuda_step_adds_no_host_sync(tmp_path: Path) -> None:
    """Issue 32: the non-finite guard (a fused AdamW skips on the device, the flag is read a
    step later) and the per-rank telemetry add no host sync to a step: a run of 12 steps
    syncs at no more places, nor more often, than a run of 6 (torch's sync debug mode
    names each site)."""
    short = _sync_sites(tmp_path / "short", 6)
    long = _sync_sites(tmp_path / "long", 12)
    print("sync sites, 6 steps:", dict(short), "12 steps:", dict(long))
    grown = {site: (short.get(site, 0), n) for site, n in long.items() if n > short.get(site, 0)}
    assert not grown, f"host syncs that grow with the step count (site: 6 steps, 12): {grown}"


@pytest.mark.requires_cuda
def test_the_guard_skips_on_the_gpu_without_a_sync_and_names_the_step_later() -> None:
    """The fused CUDA AdamW takes the guard's flag as ``found_inf``: a NaN step changes no
    weight, no moment and no step count; the next step reads the flag and names it."""
    from gpu_training.amp import MixedPrecisionStepper, NonFiniteStep, nonfinite_warning

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.Tanh(), nn.Linear(32, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    stepper = MixedPrecisionStepper(opt, "bf16", max_grad_norm=1.0, max_nonfinite_steps=3)
    x = torch.randn(8, 16, device="cuda")

    def step(poison: float = 1.0) -> None:
        with stepper.autocast():
            loss = model(x).float().pow(2).mean() * poison
        stepper.backward(loss)
        stepper.step_async(model.parameters(), 0, names=model.named_parameters)

    step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.cuda.set_sync_debug_mode("error")  # any host sync in these two steps raises
    try:
        step(math.nan)
        step(math.nan)  # reads the first one's flags: behind an event, no stream sync
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert stepper.last_nonfinite == NonFiniteStep(
        loss_ranks=(0,), parameter="0.weight", in_a_row=1, steps_ago=1
    )
    assert nonfinite_warning(stepper, 3) is not None and "step 2:" in str(
        nonfinite_warning(stepper, 3)
    )
    step()
    assert stepper.nonfinite_in_a_row == 2 and stepper.skipped_steps == 2
    step()
    assert stepper.nonfinite_in_a_row == 0
    assert not torch.equal(before["0.weight"], model.state_dict()["0.weight"])
