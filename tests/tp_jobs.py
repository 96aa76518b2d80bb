"""The job, models and plans the tensor-parallel tests share (tests/test_tensor_parallel.py).

The job is masked_task's bias-free character transformer with dropout 0.1 and targets that
mask a different number of positions per sample, the gradient clipped at 0.5 (it clips at
every step here), fp32, 8 AdamW steps of a global batch of 16, a checkpoint every 2 steps.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from torch import nn

import masked_task

__all__ = ["JOB", "STEPS", "job_file", "mlp_plan", "model", "planless_model", "train_wrong_data"]

STEPS = 8
JOB: dict[str, Any] = {
    "task": {"model": "tp_jobs:model", "data": "masked_task:data"},
    "training": {
        "global_batch_size": 16,
        "per_device_batch_size": 4,
        "learning_rate": 3e-3,
        "warmup_steps": 2,
        "max_steps": STEPS,
        "max_grad_norm": 0.5,
        "precision": "fp32",
        "seed": 3,
    },
    "strategy": {"name": "none"},
    "checkpoint": {"every": 2, "keep_last_n": 5},
    "run": {
        "log_every": 2,
        "eval_every": 4,
        "eval_batches": 2,
        "plot": False,
        "tensorboard": False,
        "progress": False,
    },
}


def model() -> nn.Module:
    """masked_task's model with dropout 0.1 in embeddings, attention and MLP."""
    return masked_task.model(dropout=0.1)


def planless_model() -> nn.Module:
    """The same model shipping no tensor-parallel plan (a user's model)."""
    built = model()
    built.tp_plan = {}  # type: ignore[assignment]  # hides the class's plan
    return built


def mlp_plan(model: nn.Module, tp_mesh: Any) -> None:
    """A plan as code (``strategy.tp_plan: tp_jobs:mlp_plan``): each MLP, as the built-in's
    MLP (the built-in plan splits the attention too)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for block in model.blocks:  # type: ignore[union-attr]
        parallelize_module(
            block, tp_mesh, {"mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()}
        )


def job_file(root: Path, name: str, strategy: dict[str, Any], **task: str) -> Path:
    """Writes ``root/name.yaml`` (output under ``root/name``) and returns its path."""
    job = copy.deepcopy(JOB)
    job["strategy"] = json.loads(json.dumps(strategy))
    job["task"].update(task)
    job["run"]["output_dir"] = str(root / name)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def train_wrong_data(job: str) -> str:
    """Rank worker of the negative control: ``train JOB`` with every TP rank reading its own
    samples (the data-parallel view replaced by the world's), otherwise the real run."""
    import gpu_training.trainer as trainer_module
    from gpu_training.cli import main

    trainer_module.data_parallel_context = lambda ctx, tp: ctx  # type: ignore[assignment]
    code = main(["train", job])
    if code != 0:
        raise SystemExit(code)
    return "done"


def train_hf_wrong_data(jobs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rank worker of the Hugging Face negative control: ``hf_runs.train_jobs`` with every
    TP rank reading its own samples (the data-parallel view replaced by the world's)."""
    import gpu_training.trainer as trainer_module
    import hf_runs

    trainer_module.data_parallel_context = lambda ctx, tp: ctx  # type: ignore[assignment]
    return hf_runs.train_jobs(jobs)
