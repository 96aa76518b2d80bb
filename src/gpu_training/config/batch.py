"""Batch and learning-rate arithmetic: accumulation for a target, exact global-batch splits.

A job is defined by its global batch ``G``; on ``W`` ranks with a per-device batch ``B`` it
takes ``A = G / (W × B)`` accumulation steps. :func:`global_batch_plan` insists on that exact
split (and its error suggests batches that fit); :func:`gradient_accumulation_for_target`
rounds up to reach at least a target instead. :func:`scale_lr` moves a learning rate tuned at
one effective batch to another. No torch import.

Example:
    >>> global_batch_plan(512, per_device_batch_size=8, world_size=4)
    16
    >>> scale_lr(1e-3, base_batch=256, new_batch=512)
    0.002
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal, get_args

from gpu_training.config.checks import ConfigError, check_choice, check_float, check_int

__all__ = [
    "LR_SCALING_RULES",
    "AccumulationPlan",
    "LRScaling",
    "accumulation_plan",
    "exact_accumulation_steps",
    "global_batch_plan",
    "global_batch_split_message",
    "gradient_accumulation_for_target",
    "scale_lr",
]

LRScaling = Literal["linear", "sqrt", "none"]

LR_SCALING_RULES: tuple[str, ...] = get_args(LRScaling)


@dataclass(frozen=True)
class AccumulationPlan:
    """How a target global batch is reached on a given number of ranks."""

    gradient_accumulation_steps: int
    effective_batch_size: int
    target_effective_batch: int

    @property
    def overshoot(self) -> int:
        """Samples per step above the target (0 when it divides exactly)."""
        return self.effective_batch_size - self.target_effective_batch


def accumulation_plan(
    target_effective_batch: int, per_device_batch_size: int, world_size: int
) -> AccumulationPlan:
    """Accumulation steps that reach at least ``target_effective_batch``, and the batch it gives.

    Raises:
        ConfigError: If an argument is not a positive integer.
    """
    check_int("target_effective_batch", target_effective_batch, 1)
    check_int("per_device_batch_size", per_device_batch_size, 1)
    check_int("world_size", world_size, 1)
    per_step = per_device_batch_size * world_size
    accum = max(1, -(-target_effective_batch // per_step))  # ceil without floats
    return AccumulationPlan(accum, accum * per_step, target_effective_batch)


def gradient_accumulation_for_target(
    target_effective_batch: int, per_device_batch_size: int, world_size: int
) -> int:
    """Gradient accumulation steps so the effective batch is ≥ the target.

    Rounds up; when the target does not divide evenly a :class:`UserWarning` reports the
    actual effective batch, so the change is never silent.

    Example:
        >>> gradient_accumulation_for_target(512, per_device_batch_size=8, world_size=4)
        16

    Raises:
        ConfigError: If an argument is not a positive integer.
    """
    plan = accumulation_plan(target_effective_batch, per_device_batch_size, world_size)
    if plan.overshoot:
        warnings.warn(
            f"target effective batch {target_effective_batch} is not a multiple of "
            f"{per_device_batch_size} per device x {world_size} ranks; using "
            f"{plan.gradient_accumulation_steps} accumulation steps for an effective batch of "
            f"{plan.effective_batch_size}",
            UserWarning,
            stacklevel=2,
        )
    return plan.gradient_accumulation_steps


def _steps(count: int) -> str:
    return f"{count} accumulation step{'s' if count != 1 else ''}"


def global_batch_split_message(
    global_batch_size: int,
    per_device_batch_size: int,
    world_size: int,
    max_global_batch: int | None = None,
) -> str:
    """Why a global batch does not split into ``world_size × per_device_batch_size``, and fixes.

    Example:
        >>> global_batch_split_message(100, 8, 3)[:60]
        'global batch 100 does not split into 3 ranks × per-device ba'
    """
    g, b, w = global_batch_size, per_device_batch_size, world_size
    per_micro = w * b
    ranks = f"{w} rank{'s' if w != 1 else ''}"
    head = (
        f"global batch {g} does not split into {ranks} × per-device batch {b} "
        f"(= {per_micro} samples per micro-step; {g} / {per_micro} = {g / per_micro:.4g} "
        "accumulation steps)"
    )
    lower = g // per_micro * per_micro
    multiples = [m for m in (lower, lower + per_micro) if m > 0]
    if max_global_batch is not None:
        multiples = [m for m in multiples if m <= max_global_batch]
    fixes = []
    if multiples:
        fixes.append(
            "a global batch of " + " or ".join(f"{m} ({_steps(m // per_micro)})" for m in multiples)
        )
    smaller = [d for d in range(b, 0, -1) if g % (w * d) == 0][:2]
    if smaller:
        fixes.append(
            "a per-device batch of " + " or ".join(f"{d} ({_steps(g // (w * d))})" for d in smaller)
        )
    if not multiples and not smaller:
        # Nothing with this per-device batch fits the dataset: offer multiples of the ranks.
        lower_w = g // w * w
        limit = lower_w + w if max_global_batch is None else max_global_batch
        for m in [m for m in (lower_w, lower_w + w) if 0 < m <= limit]:
            d = next(d for d in range(min(b, m // w), 0, -1) if m % (w * d) == 0)
            fixes.append(f"a global batch of {m} (per-device batch {d}, {_steps(m // (w * d))})")
    message = f"{head}: use {', or '.join(fixes)}" if fixes else head
    if not smaller:
        message += f"; no per-device batch works on {ranks} ({g} is not a multiple of {w})"
    if not fixes:
        message += f"; {max_global_batch} samples are too few for {ranks}"
    return message


def global_batch_plan(global_batch_size: int, per_device_batch_size: int, world_size: int) -> int:
    """Accumulation steps ``A`` so that ``world_size × per_device_batch_size × A`` is exactly G.

    Example:
        >>> global_batch_plan(64, per_device_batch_size=8, world_size=2)
        4

    Raises:
        ConfigError: If an argument is not a positive integer or the split is not exact (the
            message names the numbers and suggests batches that fit).
    """
    check_int("global_batch_size", global_batch_size, 1)
    check_int("per_device_batch_size", per_device_batch_size, 1)
    check_int("world_size", world_size, 1)
    return exact_accumulation_steps(global_batch_size, per_device_batch_size, world_size)


def exact_accumulation_steps(
    global_batch_size: int,
    per_device_batch_size: int,
    world_size: int,
    *,
    error: type[ConfigError] = ConfigError,
    max_global_batch: int | None = None,
) -> int:
    """:func:`global_batch_plan` for arguments already checked to be positive integers.

    The one split of a global batch, shared with the sampler's
    :func:`gpu_training.data.global_batch_plan`, which checks its arguments its own way and
    raises its own error class.

    Args:
        global_batch_size: Samples per optimizer step over all ranks.
        per_device_batch_size: Samples per micro-batch on one rank.
        world_size: Ranks.
        error: The class raised when the split is not exact (field ``global_batch_size``).
        max_global_batch: The largest global batch worth suggesting (the dataset's size).

    Raises:
        ConfigError: Or ``error``, when ``world_size × per_device_batch_size`` does not divide
            the global batch: :func:`global_batch_split_message`.
    """
    per_micro_step = per_device_batch_size * world_size
    if global_batch_size % per_micro_step:
        raise error(
            global_batch_split_message(
                global_batch_size, per_device_batch_size, world_size, max_global_batch
            ),
            "global_batch_size",
        )
    return global_batch_size // per_micro_step


def scale_lr(base_lr: float, base_batch: int, new_batch: int, rule: str = "linear") -> float:
    """Scale a learning rate tuned at ``base_batch`` to ``new_batch``.

    Args:
        base_lr: The tuned learning rate.
        base_batch: Effective batch it was tuned at.
        new_batch: Effective batch of this run.
        rule: ``"linear"`` (Goyal et al.: k× batch → k× LR), ``"sqrt"`` (√k×, common for
            Adam-family optimizers) or ``"none"``.

    Example:
        >>> scale_lr(1e-3, 256, 2048)
        0.008

    Raises:
        ConfigError: For an unknown rule or non-positive numbers.
    """
    check_float("base_lr", base_lr, minimum=0.0, strict=True)
    check_int("base_batch", base_batch, 1)
    check_int("new_batch", new_batch, 1)
    check_choice("rule", rule, LR_SCALING_RULES)
    factor = new_batch / base_batch
    if rule == "linear":
        return base_lr * factor
    if rule == "sqrt":
        return base_lr * math.sqrt(factor)
    return base_lr
