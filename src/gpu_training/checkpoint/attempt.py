"""One phase of a collective checkpoint operation, and how its outcome reaches every rank.

A rank's part of a phase runs inside :class:`Attempt`, which catches what it raises; then
:func:`settle`, an all-gather of every rank's outcome, raises the same
:class:`~gpu_training.checkpoint.files.CheckpointError` on every rank if any rank failed.
The exchange is also a barrier, so a rank that failed early never leaves the others blocked
in a collective it does not join, and no rank enters the next collective after a failure.
Used by the every-rank commit protocol (:mod:`~gpu_training.checkpoint.collective`) and by
the sharded and DeepSpeed loads.

Example:
    >>> from gpu_training.ddp import DistributedContext
    >>> ctx = DistributedContext()  # one process: settle() needs no process group
    >>> with Attempt() as attempt:
    ...     raise KeyError("w")
    >>> try:
    ...     settle(ctx, attempt, "could not load step 3")
    ... except CheckpointError as exc:
    ...     print(exc)
    could not load step 3: KeyError: 'w' (at <doctest ...>:2 in <module>)
"""

from __future__ import annotations

import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

from gpu_training.checkpoint.files import CheckpointError
from gpu_training.ddp import DistributedContext, process_group_up

__all__ = ["CAUGHT", "Attempt", "describe_error", "settle", "uses_process_group"]

CAUGHT = (Exception, CheckpointException)
"""What an :class:`Attempt` shares instead of raising (DCP's CheckpointException is a
BaseException); anything else (KeyboardInterrupt) is re-raised after the exchange."""


def describe_error(exc: BaseException, stack: traceback.StackSummary | None = None) -> str:
    """One line for an exception, with where it was raised unless it is our own error.

    DCP's CheckpointException carries each failed rank's exception and stack: each is listed.
    """
    if isinstance(exc, CheckpointException):
        parts = []
        for rank, wrapped in sorted(exc.failures.items()):
            inner, inner_stack = wrapped if isinstance(wrapped, tuple) else (wrapped, None)
            parts.append(f"rank {rank}: {describe_error(inner, inner_stack)}")
        return "; ".join(parts) or "DCP reported a failure"
    if isinstance(exc, CheckpointError):
        return str(exc)
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    frames = stack or traceback.extract_tb(exc.__traceback__)
    if frames:  # "KeyError: 0" alone says nothing: name the line that raised it
        last = frames[-1]
        text += f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
    return text


class Attempt:
    """Catches what one rank's part of a phase raises, to share it before anyone raises."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.exc: BaseException | None = None
        """What was raised, kept for a traceback when it is re-raised on this rank alone."""
        self.interrupt: BaseException | None = None

    def __enter__(self) -> Attempt:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None:
            return False
        self.error = describe_error(exc)
        self.exc = exc
        if not isinstance(exc, CAUGHT):  # KeyboardInterrupt: re-raised after the exchange
            self.interrupt = exc
        return True


def uses_process_group(ctx: DistributedContext) -> bool:
    """Whether this rank exchanges through the process group: False in one process.

    Raises:
        CheckpointError: A rank of several whose process group is not up.
    """
    if not ctx.is_distributed:
        return False
    if not process_group_up():
        raise CheckpointError(
            f"rank {ctx.rank} of {ctx.world_size}: sharded checkpoints need the process group; "
            "call init_distributed() first"
        )
    return True


def settle(ctx: DistributedContext, attempt: Attempt, what: str, payload: Any = None) -> list[Any]:
    """Every rank's payload; raises on every rank if any rank's attempt failed.

    The exchange is also a barrier, so a rank that failed early cannot leave the others
    blocked in a collective it never joins.
    """
    statuses: list[Any] = [(attempt.error, payload)]
    if uses_process_group(ctx):
        statuses = [None] * ctx.world_size
        dist.all_gather_object(statuses, (attempt.error, payload))
    if attempt.interrupt is not None:
        raise attempt.interrupt
    failed = [(rank, err) for rank, (err, _) in enumerate(statuses) if err is not None]
    if failed:
        if ctx.is_distributed:
            raise CheckpointError(f"{what}: " + "; ".join(f"rank {r}: {e}" for r, e in failed))
        raise CheckpointError(f"{what}: {failed[0][1]}")
    return [p for _, p in statuses]
