"""A test-only task with a planted delay on one rank: in its data, or in its compute.

``task: slow_rank_task:make_task`` with ``task_options: {slow_rank: 1, where: data,
delay_ms: 150}``: the built-in character model and corpus, except that on rank ``slow_rank``
(read from ``RANK`` when the factory runs on the rank) either each sample takes
``delay_ms / samples_per_step`` longer to load (``where: data``) or each forward pass takes
``delay_ms`` longer (``where: compute``). It lives under tests/ and is passed by import
string, as a user's task would be; nothing in the package knows about it.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from gpu_training.tasks import Task, resolve_task

__all__ = ["make_task"]

_SHAPE = {"block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 16}


class _SlowData(Dataset[Any]):
    def __init__(self, base: Any, delay_s: float) -> None:
        self.base, self.delay_s = base, delay_s

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Any:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.base[index]


class _SlowForward(nn.Module):
    """The model, with ``delay_s`` of host time before each forward."""

    def __init__(self, inner: nn.Module, delay_s: float) -> None:
        super().__init__()
        self.inner, self.delay_s = inner, delay_s

    def forward(self, inputs: torch.Tensor) -> Any:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.inner(inputs)


def make_task(
    slow_rank: int = 1, where: str = "data", delay_ms: float = 150.0, samples_per_step: int = 2
) -> Task:
    """The character task, ``delay_ms`` slower per step on ``slow_rank`` in ``where``."""
    if where not in ("data", "compute"):
        raise ValueError(f"where must be 'data' or 'compute', got {where!r}")
    base = resolve_task("charlm", _SHAPE)
    delay_s = delay_ms / 1e3 if int(os.environ.get("RANK", "0")) == slow_rank else 0.0
    forward_s = delay_s if where == "compute" else 0.0
    sample_s = delay_s / samples_per_step if where == "data" else 0.0

    def build_data() -> Any:
        train, val = base.build_data()
        return _SlowData(train, sample_s), val

    # Every rank wraps its model alike (the same parameter names for DDP, FSDP and the
    # checkpoint); only the slow rank's wrapper sleeps.
    return replace(
        base,
        build_model=lambda: _SlowForward(base.build_model(), forward_s),
        build_data=build_data,
    )
