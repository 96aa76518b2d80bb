""":class:`TrainingConfig`: a training job's hyper-parameters, with the effective batch explicit.

It checks itself on construction (:mod:`gpu_training.config.checks`), derives the
accumulation from a global batch and scales the learning rate with the effective batch
(:mod:`gpu_training.config.batch`). No torch import.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from gpu_training.config.batch import LR_SCALING_RULES, LRScaling, global_batch_plan, scale_lr
from gpu_training.config.checks import (
    ConfigError,
    check_choice,
    check_float,
    check_int,
    check_optional_int,
)

__all__ = ["PRECISIONS", "Precision", "TrainingConfig"]

Precision = Literal["auto", "fp32", "fp16", "bf16"]

PRECISIONS: tuple[str, ...] = get_args(Precision)


@dataclass
class TrainingConfig:
    """Hyper-parameters of a training job, with the effective batch made explicit.

    Example:
        >>> cfg = TrainingConfig(per_device_batch_size=32, world_size=8,
        ...                      learning_rate=1e-3, base_batch_size=32)
        >>> cfg.effective_batch_size, round(cfg.scaled_learning_rate, 6)
        (256, 0.008)

    Raises:
        ConfigError: On construction, when a field has the wrong type or is out of range.
    """

    per_device_batch_size: int = 32
    """Samples per micro-batch on each rank (what one forward pass sees)."""

    gradient_accumulation_steps: int = 1
    """Micro-batches summed per rank before each optimizer step (derived when
    ``global_batch_size`` is set)."""

    world_size: int = 1
    """Number of ranks (processes / GPUs) in the job."""

    global_batch_size: int | None = None
    """Samples per optimizer step over all ranks — the job's definition. When set, the
    accumulation is derived as ``global_batch_size / (per_device_batch_size × world_size)``,
    so the same config gives the same math on any GPU count (see :meth:`for_world_size`)."""

    learning_rate: float = 1e-3
    """Learning rate as tuned at ``base_batch_size``."""

    base_batch_size: int | None = None
    """Effective batch the learning rate was tuned at; ``None`` means "this run's batch"."""

    lr_scaling: LRScaling = "linear"
    """How the LR follows the effective batch away from ``base_batch_size``."""

    warmup_steps: int = 0
    """Optimizer steps of linear LR warmup."""

    min_lr_ratio: float = 0.0
    """Final LR of the cosine decay, as a fraction of the peak LR."""

    epochs: int = 1
    """Passes over the training data (ignored when ``max_steps`` is set)."""

    max_steps: int | None = None
    """Total optimizer steps; overrides ``epochs`` when set."""

    precision: Precision = "auto"
    """``auto`` (bf16 where supported, else fp16 on CUDA, fp32 on CPU), ``fp32``, ``fp16``, ``bf16``."""

    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value; ``None`` disables clipping."""

    max_nonfinite_steps: int | None = 5
    """A step whose loss or gradients hold a NaN/Inf on any rank is skipped on every rank
    alike (in every precision), with a warning naming the rank and the first non-finite
    gradient; this many in a row stop the run. ``None``: no guard (and no host sync per
    step for it); fp16's loss scaler still skips overflows."""

    weight_decay: float = 0.0
    """Decoupled weight decay for AdamW."""

    seed: int = 42
    """Seed for model init, data order and dropout."""

    def __post_init__(self) -> None:
        check_int("per_device_batch_size", self.per_device_batch_size, 1)
        check_int("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        check_int("world_size", self.world_size, 1)
        check_optional_int("global_batch_size", self.global_batch_size, 1)
        if self.global_batch_size is not None:
            accum = global_batch_plan(
                self.global_batch_size, self.per_device_batch_size, self.world_size
            )
            if self.gradient_accumulation_steps not in (1, accum):
                raise ConfigError(
                    f"field 'gradient_accumulation_steps': {self.gradient_accumulation_steps} "
                    f"contradicts global_batch_size {self.global_batch_size} = "
                    f"{self.per_device_batch_size} per device x {self.world_size} ranks x "
                    f"{accum}; leave it out when global_batch_size is set",
                    "gradient_accumulation_steps",
                )
            self.gradient_accumulation_steps = accum
        check_float("learning_rate", self.learning_rate, minimum=0.0, strict=True)
        check_optional_int("base_batch_size", self.base_batch_size, 1)
        check_choice("lr_scaling", self.lr_scaling, LR_SCALING_RULES)
        check_int("warmup_steps", self.warmup_steps, 0)
        check_float("min_lr_ratio", self.min_lr_ratio, minimum=0.0, strict=False)
        if self.min_lr_ratio > 1.0:
            raise ConfigError(
                f"field 'min_lr_ratio': expected a number in [0, 1], got {self.min_lr_ratio}",
                "min_lr_ratio",
            )
        check_int("epochs", self.epochs, 1)
        check_optional_int("max_steps", self.max_steps, 1)
        check_choice("precision", self.precision, PRECISIONS)
        if self.max_grad_norm is not None:
            check_float("max_grad_norm", self.max_grad_norm, minimum=0.0, strict=True)
        check_optional_int("max_nonfinite_steps", self.max_nonfinite_steps, 1)
        check_float("weight_decay", self.weight_decay, minimum=0.0, strict=False)
        check_int("seed", self.seed, 0)
        if self.max_steps is not None and self.warmup_steps > self.max_steps:
            raise ConfigError(
                f"field 'warmup_steps': expected at most max_steps ({self.max_steps}), "
                f"got {self.warmup_steps}",
                "warmup_steps",
            )

    def for_world_size(self, world_size: int) -> TrainingConfig:
        """This config on ``world_size`` ranks.

        With ``global_batch_size`` set, the accumulation is re-derived so the effective batch
        (and the math) stays the same; without it, the per-rank recipe is kept and the
        effective batch scales with the ranks (and :meth:`describe` says so).

        Raises:
            ConfigError: If the global batch does not split over ``world_size`` ranks.
        """
        accum = 1 if self.global_batch_size is not None else self.gradient_accumulation_steps
        return dataclasses.replace(self, world_size=world_size, gradient_accumulation_steps=accum)

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step: per-device batch × accumulation × world size."""
        return self.per_device_batch_size * self.gradient_accumulation_steps * self.world_size

    @property
    def scaled_learning_rate(self) -> float:
        """The learning rate for this run's effective batch (see :func:`scale_lr`)."""
        if self.base_batch_size is None or self.lr_scaling == "none":
            return float(self.learning_rate)
        return scale_lr(
            self.learning_rate, self.base_batch_size, self.effective_batch_size, self.lr_scaling
        )

    def steps_per_epoch(self, num_samples: int) -> int:
        """Optimizer steps in one pass over ``num_samples`` (incomplete last batch dropped).

        Raises:
            ValueError: If ``num_samples`` is negative.
        """
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        return num_samples // self.effective_batch_size

    def total_steps(self, num_samples: int) -> int:
        """Optimizer steps of the whole run: ``max_steps``, else epochs × steps per epoch."""
        if self.max_steps is not None:
            return self.max_steps
        return self.epochs * self.steps_per_epoch(num_samples)

    def batch_warning(self) -> str | None:
        """A warning when the effective batch differs from the one the LR was tuned at."""
        if self.base_batch_size is None or self.base_batch_size == self.effective_batch_size:
            return None
        factor = self.effective_batch_size / self.base_batch_size
        if self.lr_scaling == "none":
            return (
                f"effective batch {self.effective_batch_size} is {factor:g}x the tuned batch "
                f"{self.base_batch_size} but lr_scaling is 'none': the learning rate "
                f"{self.learning_rate:g} was tuned for a different batch"
            )
        return (
            f"effective batch {self.effective_batch_size} is {factor:g}x the tuned batch "
            f"{self.base_batch_size}: learning rate scaled ({self.lr_scaling} rule) from "
            f"{self.learning_rate:g} to {self.scaled_learning_rate:g}; consider a longer warmup"
        )

    def describe(self, num_samples: int | None = None) -> str:
        """A human-readable summary of the batch arithmetic and the learning rate.

        Args:
            num_samples: Size of the training set, to report optimizer steps per epoch.

        Returns:
            Several lines of text, ending with a ``WARNING:`` line when the effective batch
            silently moved away from the tuned batch.
        """
        lines = [
            f"effective batch: {self.effective_batch_size} = {self.per_device_batch_size} per "
            f"device x {self.gradient_accumulation_steps} accumulation x {self.world_size} ranks",
        ]
        if num_samples is not None:
            steps = self.steps_per_epoch(num_samples)
            dropped = num_samples - steps * self.effective_batch_size
            lines.append(
                f"optimizer steps per epoch: {steps} ({num_samples} samples, {dropped} dropped)"
            )
            lines.append(f"total optimizer steps: {self.total_steps(num_samples)}")
        if self.base_batch_size is None:
            lines.append(f"learning rate: {self.learning_rate:g} (no tuned batch given)")
        else:
            lines.append(
                f"learning rate: {self.scaled_learning_rate:g} ({self.lr_scaling} scaling from "
                f"{self.learning_rate:g} at batch {self.base_batch_size})"
            )
        lines.append(f"warmup steps: {self.warmup_steps}, precision: {self.precision}")
        warning = self.batch_warning()
        if warning:
            lines.append(f"WARNING: {warning}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (round-trips through :meth:`from_dict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> TrainingConfig:
        """Build a config from a mapping, rejecting unknown keys with a close-match hint.

        Args:
            data: Field names to values.
            source: A file name to prefix error messages with.

        Raises:
            ConfigError: For an unknown key, a wrong type or an out-of-range value.
        """
        prefix = f"{source}: " if source else ""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{prefix}expected a mapping of field names to values, got {type(data).__name__}"
            )
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                close = difflib.get_close_matches(str(key), names, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(f"{prefix}unknown field '{key}'{hint}", str(key))
        try:
            return cls(**dict(data))
        except ConfigError as err:
            raise ConfigError(f"{prefix}{err}", err.field) from None
