"""The main job end to end: `gpu-training train` on CPU ranks, resume, parity, bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dist_harness import REPO_ROOT, run_python
from train_jobs import train

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

TINY = {
    "task": "charlm",
    "task_options": {"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32},
    "training": {
        "global_batch_size": 16,
        "per_device_batch_size": 8,
        "learning_rate": 3e-3,
        "warmup_steps": 2,
        "max_steps": 8,
        "precision": "fp32",
        "seed": 7,
    },
    "strategy": {"name": "ddp"},
    "checkpoint": {"every": 4, "keep_last_n": 2},
    "run": {"log_every": 2, "eval_every": 4, "eval_batches": 2},
}


def _write_job(tmp_path: Path, name: str = "job", **changes: Any) -> tuple[Path, Path]:
    job = yaml.safe_load(yaml.safe_dump(TINY))
    for dotted, value in changes.items():
        section, field = dotted.split("__")
        job.setdefault(section, {})[field] = value
    out = tmp_path / f"{name}-out"
    job["run"]["output_dir"] = str(out)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path, out


def _train(
    config: Path, nproc: int, *extra: str, timeout: float = 200
) -> subprocess.CompletedProcess[str]:
    args = ["-m", "gpu_training", "train", str(config), "--nproc", str(nproc), *extra]
    return run_python(args, timeout=timeout, cwd=REPO_ROOT)


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    steps = sorted((out / "checkpoints").glob("step-*"))
    state = torch.load(steps[-1] / "state.pt", weights_only=True)
    return state["model_state"]


@pytest.mark.slow
def test_train_on_two_ranks_reports_from_rank0_and_writes_outputs(tmp_path: Path) -> None:
    config, out = _write_job(tmp_path)
    proc = _train(config, 2)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert text.count("effective batch: 16 = 8 per device x 1 accumulation x 2 ranks") == 1
    assert "strategy: ddp on 2 rank(s), backend gloo" in text
    assert len(re.findall(r"^step 8/8 \| loss", text, re.M)) == 1, "rank 0 only"
    losses = [float(x) for x in re.findall(r"^step \d+/8 \| loss ([0-9.]+)", text, re.M)]
    assert losses[-1] < losses[0]
    assert (out / "metrics.jsonl").is_file() and (out / "loss.png").is_file()
    assert [p.name for p in sorted((out / "checkpoints").glob("step-*"))] == [
        "step-00000004",
        "step-00000008",
    ]
    # The same command again resumes at the end and does nothing more.
    again = _train(config, 2)
    assert again.returncode == 0 and "run already complete at step 8" in again.stdout


def test_one_rank_two_microsteps_equals_two_ranks_one(tmp_path: Path) -> None:
    one, out1 = _write_job(tmp_path, "w1")
    two, out2 = _write_job(tmp_path, "w2")
    train(one, 1)
    train(two, 2)
    a, b = _final_weights(out1), _final_weights(out2)
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff <= 1e-5, f"1x2 vs 2x1 differ by {diff:.2e}"


def _consolidated(step_dir: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = tmp_path / f"consolidated-{len(list(tmp_path.glob('*.safetensors')))}.safetensors"
    proc = run_python(
        ["-m", "gpu_training", "ckpt", "consolidate", str(step_dir), str(out)],
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return load_file(out)


@pytest.mark.slow
@pytest.mark.skipif(find_spec("deepspeed") is None, reason="needs the deepspeed extra")
def test_deepspeed_zero3_job_matches_ddp_and_resumes_exactly(tmp_path: Path) -> None:
    """ZeRO-3 through the Trainer: same weights as DDP, atomic checkpoints, exact resume."""
    ddp, out_ddp = _write_job(tmp_path, "ddp")
    zero, out_zero = _write_job(
        tmp_path, "zero3", strategy__name="deepspeed", strategy__zero_stage=3
    )
    train(ddp, 2)
    stdout = train(zero, 2, timeout=280)
    assert "strategy: deepspeed on 2 rank(s)" in stdout
    last = out_zero / "checkpoints" / "step-00000008"
    manifest = json.loads((last / "manifest.json").read_text())
    assert manifest["state_format"] == "deepspeed" and manifest["world_size"] == 2
    assert not (out_zero / "checkpoints" / "latest").exists(), "the manifest is the truth"
    reference, zero_weights = _final_weights(out_ddp), _consolidated(last, tmp_path)
    assert zero_weights.keys() == reference.keys()
    diff = max((zero_weights[k] - reference[k]).abs().max().item() for k in reference)
    assert diff <= 1e-5, f"ZeRO-3 vs DDP differ by {diff:.2e} after 8 steps (fp32)"

    # Lose the last checkpoint: the run resumes from step 4 and ends bitwise where it did.
    shutil.move(last, tmp_path / "uninterrupted")
    again = train(zero, 2, timeout=280)
    assert "(step 4)" in again and "step 8/8 | loss" in again
    before = _consolidated(tmp_path / "uninterrupted", tmp_path)
    after = _consolidated(last, tmp_path)
    assert all(torch.equal(before[k], after[k]) for k in before), "resume is not exact"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp_config.yaml", "fsdp_config.yaml", "deepspeed_job.yaml"])
def test_shipped_configs_run_with_train(tmp_path: Path, name: str) -> None:
    if name.startswith("deepspeed") and find_spec("deepspeed") is None:
        pytest.skip("needs the deepspeed extra")
    sets = {
        "training.max_steps": 2,
        "training.warmup_steps": 1,
        "checkpoint.every": 2,
        "run.eval_every": 2,
        "run.eval_batches": 1,
        "run.log_every": 1,
        "run.output_dir": str(tmp_path / "out"),
    }
    args = [x for key, value in sets.items() for x in ("--set", f"{key}={value}")]
    proc = _train(REPO_ROOT / "configs" / name, 2, *args, timeout=280)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "step 2/2 | loss" in proc.stdout and "val loss" in proc.stdout
    assert (tmp_path / "out" / "checkpoints" / "step-00000002" / "manifest.json").is_file()


@pytest.mark.slow
def test_killed_run_continues_from_last_checkpoint(tmp_path: Path) -> None:
    config, out = _write_job(tmp_path, training__max_steps=40, checkpoint__every=4)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "gpu_training", "train", str(config), "--nproc", "2"]
    proc = subprocess.Popen(
        argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not list((out / "checkpoints").glob("step-*")):
            time.sleep(0.2)
        assert list((out / "checkpoints").glob("step-*")), "no checkpoint appeared"
    finally:
        _kill_tree(proc.pid)
        proc.wait(timeout=30)
    saved = max(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))
    resumed = _train(config, 2)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    match = re.search(r"resumed from \S+ \(step (\d+)\)", resumed.stdout)
    assert match and int(match.group(1)) >= saved
    assert "step 40/40 | loss" in resumed.stdout


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and everything below it (torchrun starts workers in new sessions)."""
    children = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True
    ).stdout.split()
    for child in children:
        _kill_tree(int(child))
    with __import__("contextlib").suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"strategy__name": "dpp"}, "unknown strategy 'dpp' (did you mean 'ddp'?)"),
        (
            {"strategy__name": "deepspeed", "strategy__deepspeed_config": "DS_WITH_SCHEDULER"},
            "has a 'scheduler' section",
        ),
        ({"strategy__block_classes": ["Blok"]}, "Blok"),
        ({"training__lerning_rate": 0.1}, "did you mean 'learning_rate'"),
        (
            {"task__model": "no_such_pkg.models:build", "task__data": "no_such_pkg.data:build"},
            "no_such_pkg",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(
    tmp_path: Path, changes: dict[str, Any], fragment: str
) -> None:
    if "task__model" in changes:
        config, out = _write_job(tmp_path)
        job = yaml.safe_load(config.read_text())
        job["task"] = {"model": changes["task__model"], "data": changes["task__data"]}
        config.write_text(yaml.safe_dump(job))
    else:
        if changes.get("strategy__deepspeed_config") == "DS_WITH_SCHEDULER":
            ds = json.loads((REPO_ROOT / "configs" / "deepspeed_config.json").read_text())
            ds["scheduler"] = {"type": "WarmupLR", "params": {}}
            (tmp_path / "ds.json").write_text(json.dumps(ds))
            changes = {**changes, "strategy__deepspeed_config": str(tmp_path / "ds.json")}
        config, out = _write_job(tmp_path, **changes)
    proc = _train(config, 2, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-training: error: "), proc.stderr
    assert fragment in lines[0]
    assert not out.exists(), "nothing may be written on bad input"


def test_deepspeed_job_without_the_extra_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without deepspeed installed: one StrategyError naming the field and the extra."""
    import importlib.util

    from gpu_training.job import load_job
    from gpu_training.strategy import StrategyError
    from gpu_training.trainer import check_job

    config, _ = _write_job(tmp_path, strategy__name="deepspeed")
    job = load_job(config)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "deepspeed" else real_find_spec(name, *a),
    )
    with pytest.raises(StrategyError, match=r"'strategy.name'.*gpu-training\[deepspeed\]"):
        check_job(job)


def test_fsdp_job_saves_sharded_and_resumes(tmp_path: Path) -> None:
    config, out = _write_job(
        tmp_path, strategy__name="fsdp", training__max_steps=4, checkpoint__every=2
    )
    train(config, 2)
    step_dir = out / "checkpoints" / "step-00000004"
    assert (step_dir / ".metadata").is_file() and (step_dir / "manifest.json").is_file()
    job = yaml.safe_load(config.read_text())
    job["training"]["max_steps"] = 6
    config.write_text(yaml.safe_dump(job))
    refused = _train(config, 2)  # a longer schedule changes the LR of the steps already taken
    assert refused.returncode == 2 and "training.max_steps: 4 -> 6" in refused.stderr
    second = train(config, 2, "--allow-config-change")
    assert "warning: resuming step-00000004 with changed settings" in second
    assert "resumed from" in second and "(step 4)" in second
    assert "step 6/6 | loss" in second
