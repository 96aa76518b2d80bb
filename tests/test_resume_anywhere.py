"""Resume anywhere between none / DDP (plain checkpoints) and FSDP2 (sharded), any world size.

A run stopped after step 10 of 20 at one layout and resumed by ``gpu-training train`` at
another (strategy and rank count) ends where 20 uninterrupted steps at the new layout end,
within 1e-5: the bias-free charlm job of tests/test_invariance.py, dropout on, fp32. The
cases cross the format both ways and change the world size up, down and not at all:

- DDP x 2 -> FSDP x 4 and a plain model x 1 -> FSDP x 2 (a plain ``state.pt`` broadcast
  from rank 0 into the shards, the optimizer state renamed by parameter);
- FSDP x 4 -> a plain model x 1 and FSDP x 2 -> DDP x 2 (DCP resharding into whole tensors).

The negative control resumes DDP x 2 -> FSDP x 4 with the optimizer state dropped and must
miss the uninterrupted run. Through the real command line: the line ``train`` prints before
any process starts. A checkpoint whose model does not fit the job under the other format is
bad input (one line, exit 2, nothing written): tests/bad_input_place_cases.py,
``other-model-shape-under-*``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dist_harness import REPO_ROOT, run_python, run_ranks
from train_jobs import train

pytestmark = [pytest.mark.multirank, pytest.mark.slow, pytest.mark.timeout(400)]

TOL = 1e-5
STEPS = 20
_JOB: dict[str, Any] = {
    "task": "charlm",
    "task_options": {
        "block_size": 32,
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 32,
        "dropout": 0.1,
        "bias": False,
    },
    "training": {
        "global_batch_size": 16,
        "per_device_batch_size": 4,
        "learning_rate": 3e-3,
        "warmup_steps": 2,
        "max_steps": STEPS,
        "precision": "fp32",
        "seed": 3,
    },
    "strategy": {"name": "ddp"},
    "checkpoint": {"every": 10, "keep_last_n": 5},
    "run": {
        "log_every": 1,
        "eval_every": 10,
        "eval_batches": 2,
        "plot": False,
        "tensorboard": False,
        "progress": False,
    },
}

LAYOUTS = {"ddp2": ("ddp", 2), "fsdp2": ("fsdp", 2), "fsdp4": ("fsdp", 4), "none1": ("none", 1)}
"""The uninterrupted runs: each is a case's target, and a stopped copy of it a case's source."""
_RESHARDED = "optimizer state resharded"


def _job_file(out: Path, strategy: str) -> Path:
    job = json.loads(json.dumps(_JOB))
    job["strategy"] = {"name": strategy}
    job["run"]["output_dir"] = str(out)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _weights(out: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    step_dir = out / "checkpoints" / f"step-{step:08d}"
    if (step_dir / "state.pt").exists():
        return torch.load(step_dir / "state.pt", weights_only=True)["model_state"]
    from gpu_training.checkpoint import consolidate

    target = out / "weights.pt"
    consolidate(step_dir, target, overwrite=True)
    return torch.load(target, weights_only=True)


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _stopped_copy(run: Path, out: Path) -> Path:
    """``run`` as it stood after step 10 (the metrics it logged later are cut on resume)."""
    shutil.copytree(run, out)
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS:08d}")
    (out / "weights.pt").unlink(missing_ok=True)  # consolidated by _weights
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    runs = {}
    for name, (strategy, nproc) in LAYOUTS.items():
        runs[name] = tmp / name
        train(_job_file(runs[name], strategy), nproc)
    return runs


@pytest.mark.parametrize(
    ("source", "target", "said"),
    [
        ("ddp2", "fsdp4", f"written by DDP on 2 ranks under FSDP on 4: {_RESHARDED}"),
        ("none1", "fsdp2", f"written by a plain model on 1 rank under FSDP on 2: {_RESHARDED}"),
        ("fsdp4", "none1", f"written by FSDP on 4 ranks under a plain model on 1: {_RESHARDED}"),
        ("fsdp2", "ddp2", f"written by FSDP on 2 ranks under DDP on 2: {_RESHARDED}"),
    ],
    ids=["ddp2-fsdp4", "none1-fsdp2", "fsdp4-none1", "fsdp2-ddp2"],
)
def test_a_run_resumes_under_another_format_and_world_size(
    uninterrupted: dict[str, Path], tmp_path: Path, source: str, target: str, said: str
) -> None:
    out = _stopped_copy(uninterrupted[source], tmp_path / "resumed")
    strategy, nproc = LAYOUTS[target]
    printed = train(_job_file(out, strategy), nproc)
    assert f"(step 10 {said})" in printed, printed
    diff = _diff(_weights(uninterrupted[target]), _weights(out))
    assert diff <= TOL, f"{source} -> {target} after step 10: {diff:.2e}"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, STEPS + 1))


def _dropping_the_optimizer_state(argv: list[str]) -> None:
    """A rank of ``train`` whose plain-to-sharded load keeps the fresh optimizer."""
    import gpu_training.checkpoint.reshard as reshard
    from gpu_training.cli import main

    reshard.set_optimizer_state_dict = lambda *args, **kwargs: None  # type: ignore[assignment]
    code = main(argv)
    if code != 0:
        raise SystemExit(code)


def test_the_negative_control_drops_the_optimizer_state_and_misses(
    uninterrupted: dict[str, Path], tmp_path: Path
) -> None:
    out = _stopped_copy(uninterrupted["ddp2"], tmp_path / "dropped")
    argv = ["train", str(_job_file(out, "fsdp"))]
    run_ranks(_dropping_the_optimizer_state, 4, args=(argv,), timeout=300)
    diff = _diff(_weights(uninterrupted["fsdp4"]), _weights(out))
    assert diff > 100 * TOL, f"without its optimizer state the resume still matched: {diff:.2e}"


def test_train_says_how_it_resumes_before_any_process_starts(
    uninterrupted: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "finished"
    shutil.copytree(uninterrupted["ddp2"], out)  # step 20: it loads, then has nothing to do
    job = _job_file(out, "ddp")
    argv = ["-m", "gpu_training", "train", str(job), "--nproc", "2", "--set", "strategy.name=fsdp"]
    proc = run_python(argv, timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    said = "written by DDP on 2 ranks under FSDP on 2: optimizer state resharded"
    assert lines[0] == f"resuming step 20 {said}", proc.stdout
    assert any(line.endswith(f"(step 20 {said})") for line in lines), proc.stdout
