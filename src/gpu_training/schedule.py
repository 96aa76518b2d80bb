"""Learning-rate schedules (torch only, nothing distributed).

Linear warmup then cosine decay is the standard companion of LR scaling: when the effective
batch grows k×, the LR grows k× and a warmup keeps the first steps stable.

Example:
    >>> import torch
    >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    >>> sched = linear_warmup_cosine_lr(opt, warmup_steps=2, total_steps=6)
    >>> lrs = []
    >>> for _ in range(6):
    ...     lrs.append(round(opt.param_groups[0]["lr"], 3))
    ...     opt.step(); sched.step()
    >>> lrs
    [0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["linear_warmup_cosine_lr", "warmup_cosine_factor"]


def warmup_cosine_factor(
    step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
) -> float:
    """The LR multiplier at optimizer step ``step`` (0-based).

    Warmup ramps ``1/w, 2/w, …, 1`` over the first ``w`` steps (never 0: a zero-LR first step
    is a wasted step); cosine then decays from 1 to ``min_lr_ratio`` at ``total_steps`` and
    stays there.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def linear_warmup_cosine_lr(
    optimizer: torch.optim.Optimizer,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.0,
) -> LambdaLR:
    """Linear warmup to the optimizer's LR, then cosine decay to ``min_lr_ratio`` × LR.

    Call ``scheduler.step()`` once per optimizer step (not per micro-batch).

    Args:
        optimizer: Its param groups' ``lr`` is the peak LR.
        warmup_steps: Steps of linear warmup (0 for none).
        total_steps: Total optimizer steps of the run (≥ ``warmup_steps``).
        min_lr_ratio: Final LR as a fraction of the peak, in [0, 1].

    Returns:
        A :class:`torch.optim.lr_scheduler.LambdaLR` (its ``state_dict`` checkpoints it).

    Raises:
        ValueError: For negative steps, ``warmup_steps > total_steps`` or a ratio outside [0, 1].
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if warmup_steps > total_steps:
        raise ValueError(
            f"warmup_steps ({warmup_steps}) must not exceed total_steps ({total_steps})"
        )
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")

    def factor(step: int) -> float:
        return warmup_cosine_factor(step, warmup_steps, total_steps, min_lr_ratio)

    return LambdaLR(optimizer, factor)
