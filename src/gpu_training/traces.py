"""Where a training step's time goes: a ``torch.profiler`` trace of a few steps.

:func:`profile_steps` runs a step function under :mod:`torch.profiler` (warm-up steps
discarded), writes a Chrome/Perfetto trace on the main process and returns it with the top
operators as a :class:`ProfileResult`; the other ranks run the same steps unprofiled, so
collectives still match. :mod:`gpu_training.profiling` (the guides' module) re-exports both names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpu_training.config.checks import check_int_argument, check_positive_int_argument
from gpu_training.ddp import DistributedContext

__all__ = ["ProfileResult", "profile_steps"]


@dataclass(frozen=True)
class ProfileResult:
    """Where :func:`profile_steps` wrote its trace, and the top operators."""

    trace_path: Path | None
    """Chrome/Perfetto trace (open in https://ui.perfetto.dev); None on ranks that do not write."""
    table: str
    """``key_averages()`` of the profiled steps, sorted by device (else CPU) time."""


def profile_steps(
    step_fn: Callable[[int], Any],
    out_dir: str | Path,
    *,
    steps: int = 5,
    warmup: int = 2,
    ctx: DistributedContext | None = None,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = False,
    row_limit: int = 15,
) -> ProfileResult:
    """Run ``warmup + steps`` calls of ``step_fn(i)`` under :mod:`torch.profiler`; write a trace.

    The first ``warmup`` calls are profiled but discarded (kernel autotuning, allocator
    growth), the next ``steps`` recorded. Only the main process profiles and writes
    ``trace_rank<r>.json`` under ``out_dir``; other ranks run the steps unprofiled, so every
    rank still makes the same collective calls.

    Args:
        step_fn: One training step; receives the call index.
        out_dir: Directory for the trace (created).
        steps: Steps to record.
        warmup: Steps to run before recording.
        ctx: The distributed context (default: single process).
        record_shapes: Record operator input shapes.
        profile_memory: Record tensor allocations (the trace's memory view).
        with_stack: Record Python stacks (large traces).
        row_limit: Rows of the summary table.

    Returns:
        A :class:`ProfileResult`.

    Example:
        >>> import tempfile
        >>> model = torch.nn.Linear(32, 32)
        >>> with tempfile.TemporaryDirectory() as out:
        ...     result = profile_steps(lambda i: model(torch.randn(8, 32)).sum().backward(),
        ...                            out, steps=2, warmup=1)
        ...     result.trace_path.is_file()
        True
        >>> result.trace_path.name, "aten::" in result.table
        ('trace_rank0.json', True)
    """
    check_positive_int_argument("steps", steps)
    check_int_argument("warmup", warmup, 0)
    context = ctx or DistributedContext()
    if not context.is_main_process:
        for i in range(warmup + steps):
            step_fn(i)
        return ProfileResult(None, "")
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    trace = directory / f"trace_rank{context.rank}.json"
    with profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace)),
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
    ) as prof:
        for i in range(warmup + steps):
            step_fn(i)
            prof.step()
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=row_limit)
    return ProfileResult(trace, table)
