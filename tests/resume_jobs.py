"""The job, the layouts and the comparisons the resume-anywhere tests share.

A layout is a strategy on a number of ranks, named as the tests write it: ``none1``,
``ddp2``, ``fsdp4``, ``zero2x4`` (DeepSpeed ZeRO-2 on 4 ranks), ``zero3offx2`` (ZeRO-3 with its
optimizer state offloaded to the CPU, 2 ranks). The job is the bias-free charlm of
tests/test_invariance.py with dropout on, fp32, 20 steps, a checkpoint every 10: a stopped
copy of an uninterrupted run (its step-20 checkpoint removed) resumes from step 10.
Used by tests/test_resume_anywhere.py (the subset ``make test`` runs) and
tests/test_resume_matrix.py (every pair, ``make test-matrix``).
"""

from __future__ import annotations

import json
import re
import shutil
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch
import yaml

__all__ = [
    "JOB",
    "STEPS",
    "TOL",
    "diff",
    "has_deepspeed",
    "job_file",
    "layout",
    "stopped_copy",
    "title",
    "weights",
]

TOL = 1e-5
STEPS = 20
JOB: dict[str, Any] = {
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

_LAYOUT_RE = re.compile(r"^(none|ddp|fsdp|zero([123])(off)?x)(\d)$")


def layout(name: str) -> tuple[dict[str, Any], int]:
    """The strategy and rank count a layout's name stands for (see the module docstring)."""
    found = _LAYOUT_RE.match(name)
    assert found is not None, f"not a layout name: {name}"
    kind, stage, offload, ranks = found.groups()
    if stage is None:
        return {"name": kind}, int(ranks)
    strategy: dict[str, Any] = {"name": "deepspeed", "zero_stage": int(stage)}
    if offload:
        strategy["offload"] = "optimizer"
    return strategy, int(ranks)


def title(name: str) -> str:
    """How ``train`` names a layout's strategy in its resume line (``ZeRO-2``, ``DDP``,
    ``ZeRO-3 with CPU offload``...)."""
    strategy, _ = layout(name)
    if strategy["name"] == "deepspeed":
        offload = " with CPU offload" if "offload" in strategy else ""
        return f"ZeRO-{strategy['zero_stage']}{offload}"
    return {"none": "a plain model", "ddp": "DDP", "fsdp": "FSDP"}[strategy["name"]]


def has_deepspeed(name: str) -> bool:
    """Whether a layout can run here (DeepSpeed's need the deepspeed extra)."""
    return layout(name)[0]["name"] != "deepspeed" or find_spec("deepspeed") is not None


def job_file(out: Path, strategy: dict[str, Any]) -> Path:
    """The job, writing into ``out``, under ``strategy``: its YAML file beside ``out``."""
    job = json.loads(json.dumps(JOB))
    job["strategy"] = dict(strategy)
    job["run"]["output_dir"] = str(out)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def weights(out: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    """The fp32 weights of a run's checkpoint ``step``, whatever its format."""
    step_dir = out / "checkpoints" / f"step-{step:08d}"
    if (step_dir / "state.pt").exists():
        return torch.load(step_dir / "state.pt", weights_only=True)["model_state"]
    from gpu_training.checkpoint import consolidate

    target = out / "weights.pt"
    consolidate(step_dir, target, overwrite=True)
    return torch.load(target, weights_only=True)


def diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state dicts of the same keys."""
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def stopped_copy(run: Path, out: Path) -> Path:
    """``run`` as it stood after step 10 (the metrics it logged later are cut on resume)."""
    shutil.copytree(run, out)
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS:08d}")
    (out / "weights.pt").unlink(missing_ok=True)  # consolidated by weights()
    return out
