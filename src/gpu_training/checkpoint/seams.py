"""What a checkpoint format is handed: the run it saves and loads, and the manager it uses.

Two protocols, below :mod:`~gpu_training.checkpoint.formats` (which re-exports them):
:class:`Checkpointable` (:class:`~gpu_training.strategy.Prepared` is one) and
:class:`Checkpoints`, the :class:`~gpu_training.checkpoint.CheckpointManager` as a format sees
it, handed in because the formats sit below the manager.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

__all__ = ["Checkpointable", "Checkpoints", "Loaded", "Order", "PathOrStep"]

PathOrStep = str | os.PathLike[str] | int
"""A checkpoint directory, or a step number in the root (as the manager takes it)."""
Loaded = tuple[dict[str, Any], dict[str, Any]]
"""What a format's load returns: the run state saved, and the caller's extra."""
Order = list[list[str]]
"""A run's trainable parameter names by optimizer param group, in its optimizer's order."""


class Checkpointable(Protocol):
    """What a format saves and loads in a run (:class:`~gpu_training.strategy.Prepared` is one)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    engine: Any
    """The ``DeepSpeedEngine`` under DeepSpeed, else None."""


class Checkpoints(Protocol):
    """The manager as a format sees it: what a run saves through and loads from.

    :class:`~gpu_training.checkpoint.CheckpointManager` is the one; it is handed in, as this
    module sits below it.
    """

    def save(self, state: Mapping[str, Any], step: int) -> Path | None: ...

    def load(self, path_or_step: PathOrStep | None = None) -> dict[str, Any]: ...

    def save_sharded(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        step: int,
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> Path | None: ...

    def load_sharded(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        path_or_step: PathOrStep | None = None,
    ) -> dict[str, Any]: ...

    def load_plain_into(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        path_or_step: PathOrStep | None = None,
    ) -> dict[str, Any]: ...

    def manifest(self, path_or_step: PathOrStep) -> dict[str, Any]: ...

    def save_deepspeed(
        self, engine: Any, step: int, *, extra: Mapping[str, Any] | None = None
    ) -> Path | None: ...

    def load_deepspeed(
        self, engine: Any, path_or_step: PathOrStep | None = None
    ) -> dict[str, Any]: ...

    def load_into_deepspeed(self, engine: Any, path_or_step: PathOrStep) -> Loaded: ...

    def load_resharded(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path_or_step: PathOrStep
    ) -> Loaded: ...
