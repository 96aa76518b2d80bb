"""What the step loop keeps between log steps, and when its records go to disk.

:class:`LogWindow` holds a log window's device-side micro-batch losses and gradient norms
(one host sync per window, at the log step) and turns them into the window's loss and mean
norm. :class:`FlushClock` says when each rank's buffered telemetry rows are due on disk: at
a log step at least :data:`FLUSH_SECONDS` after the last write (the Trainer also writes them
at every checkpoint, at the end of the run, on a failure and on a stall), so a tiny step does
not pay a file write per rank every ``run.log_every`` steps, and a crash loses at most about a
second of them. ``metrics.jsonl`` (rank 0) is written at every log step: a stalled run's last
row must be on disk.

Example:
    >>> import torch
    >>> window = LogWindow(start_step=0, last_saved=0)
    >>> window.losses += [torch.tensor(2.0), torch.tensor(4.0)]
    >>> float(window.loss(skipped_steps=0))
    3.0
    >>> window.losses.append(torch.tensor(float("nan")))  # a skipped step's loss
    >>> float(window.loss(skipped_steps=1))  # a skip in the window: non-finite ones left out
    3.0
    >>> clock = FlushClock(interval=0.0)
    >>> clock.due()
    True
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gpu_training.amp import MixedPrecisionStepper

__all__ = ["FLUSH_SECONDS", "FlushClock", "LogWindow", "guarded_skips", "mean_finite"]

FLUSH_SECONDS = 1.0
"""Buffered log lines are written at the first log step this many seconds after the last write."""


class FlushClock:
    """Whether buffered records are due on disk: one ``time.monotonic()`` per question.

    Args:
        interval: Seconds between writes (0: every time).
    """

    __slots__ = ("_last", "interval")

    def __init__(self, interval: float = FLUSH_SECONDS) -> None:
        self.interval = interval
        self._last = time.monotonic()

    def due(self) -> bool:
        """True when ``interval`` seconds passed since the last True (the write it allows)."""
        now = time.monotonic()
        if now - self._last < self.interval:
            return False
        self._last = now
        return True


def guarded_skips(stepper: MixedPrecisionStepper | None) -> int:
    """Steps the NaN guard skipped so far (0 without a guard: its windows filter nothing)."""
    if stepper is None or stepper.max_nonfinite_steps is None:
        return 0
    return stepper.skipped_steps


def mean_finite(norms: list[torch.Tensor]) -> float:
    """Mean of the finite gradient norms of a log window (one host sync for all of them)."""
    if not norms:
        return 0.0
    if len(norms) == 1:  # no clipping: the log step's norm only, read without a stack
        value = float(norms[0])
        return value if math.isfinite(value) else 0.0
    values = torch.stack(norms).double().cpu()  # one step function: one device for all
    finite = values[torch.isfinite(values)]
    return float(finite.mean()) if finite.numel() else 0.0  # every step overflowed (fp16)


@dataclass
class LogWindow:
    """What the loop keeps between log steps, and across the run."""

    start_step: int
    last_saved: int
    losses: list[torch.Tensor] = field(default_factory=list)
    """Device-side micro-batch losses of the log window: one host sync per window."""
    norms: list[torch.Tensor] = field(default_factory=list)
    first_loss: float = math.nan
    skipped_before: int = 0
    """The stepper's skipped steps when the window began: a window without a skip keeps
    every loss (no filter, no op)."""
    clock: FlushClock = field(default_factory=FlushClock)
    """When the buffered metrics and telemetry lines are due on disk."""

    def loss(self, skipped_steps: int) -> torch.Tensor:
        """The window's mean micro-batch loss (0-d float64; NaN when every step was skipped).

        ``skipped_steps``: the stepper's count now. When it moved in the window, non-finite
        losses are left out (a step found skipped a step later added its loss already).
        """
        if not self.losses:
            return torch.tensor(math.nan, dtype=torch.float64)
        losses = torch.stack(self.losses).double()
        if skipped_steps != self.skipped_before:
            losses = losses[losses.isfinite()]
            if not losses.numel():
                return torch.tensor(math.nan, dtype=torch.float64)
        return losses.mean()

    def clear(self, skipped_steps: int) -> None:
        """Starts the next window (``skipped_steps``: the stepper's count now)."""
        self.losses.clear()
        self.norms.clear()
        self.skipped_before = skipped_steps
