"""Training configuration: the effective batch, learning-rate scaling, and validated loading.

A distributed job is defined by the batch the optimizer sees, not by the per-GPU batch::

    effective_batch = per_device_batch_size × gradient_accumulation_steps × world_size

:class:`TrainingConfig` keeps that number explicit, scales the learning rate when it moves
away from the batch the LR was tuned at, and checks itself on construction so that a typo in
a YAML file is one clear line instead of a silent default. This package imports no torch:
``gpu-training`` can read and check a config in a fraction of a second.

The package: :mod:`~gpu_training.config.training` (:class:`TrainingConfig`),
:mod:`~gpu_training.config.batch` (the batch and learning-rate arithmetic),
:mod:`~gpu_training.config.files` (YAML/JSON files and ``--set`` overrides) and
:mod:`~gpu_training.config.checks` (:class:`ConfigError` and the value checks the config
classes share); everything public is re-exported here.

Example:
    >>> from gpu_training.config import TrainingConfig, gradient_accumulation_for_target
    >>> accum = gradient_accumulation_for_target(512, per_device_batch_size=8, world_size=4)
    >>> cfg = TrainingConfig(per_device_batch_size=8, gradient_accumulation_steps=accum,
    ...                      world_size=4)
    >>> cfg.effective_batch_size
    512
"""

from __future__ import annotations

from gpu_training.config.batch import (
    LR_SCALING_RULES,
    AccumulationPlan,
    accumulation_plan,
    global_batch_plan,
    global_batch_split_message,
    gradient_accumulation_for_target,
    scale_lr,
)
from gpu_training.config.batch import LRScaling as LRScaling
from gpu_training.config.checks import ConfigError
from gpu_training.config.files import load_config, parse_override, read_config_file
from gpu_training.config.training import PRECISIONS, TrainingConfig
from gpu_training.config.training import Precision as Precision

__all__ = [
    "LR_SCALING_RULES",
    "PRECISIONS",
    "AccumulationPlan",
    "ConfigError",
    "TrainingConfig",
    "accumulation_plan",
    "global_batch_plan",
    "global_batch_split_message",
    "gradient_accumulation_for_target",
    "load_config",
    "parse_override",
    "read_config_file",
    "scale_lr",
]
