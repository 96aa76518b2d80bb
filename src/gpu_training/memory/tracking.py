"""Watching memory while training: :func:`memory_tracking`, :func:`clear_cuda_cache`, and
:func:`explain_oom`, the guide's out-of-memory flowchart as a function.

The guide's loop::

    with memory_tracking(label="training_step") as tracker:
        loss = model(batch)
        loss.backward()
        optimizer.step()
    print(f"Step allocated {format_bytes(tracker['allocated_delta'])}")

On CUDA the numbers come from the caching allocator; on the CPU, which keeps no allocator
statistics, from a :class:`~gpu_training.memory.LiveTensorTracker` (tensors created inside
the block) and the process's resident set size.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_training.memory.budget import MemoryEstimate, format_bytes

__all__ = ["OOMDiagnosis", "clear_cuda_cache", "explain_oom", "memory_tracking"]

logger = logging.getLogger(__name__)


# --- cache -----------------------------------------------------------------------------------


def clear_cuda_cache() -> int:
    """Collect garbage and return the CUDA caching allocator's free blocks to the driver.

    Frees no tensor that is still referenced: it helps when fragmentation (cached but
    unusable blocks) is what runs out, or before another process needs the memory.

    Returns:
        Bytes the allocator gave back (0 without CUDA).

    Example:
        >>> clear_cuda_cache() >= 0
        True
    """
    gc.collect()
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return 0
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return max(0, before - torch.cuda.memory_reserved())


# --- tracking --------------------------------------------------------------------------------


def _rss_bytes() -> int | None:
    """Resident set size of this process (Linux /proc, else psutil), or None."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except (ImportError, OSError):
        return None


@contextlib.contextmanager
def memory_tracking(
    label: str = "block", device: Any = None, *, log: bool = True
) -> Iterator[dict[str, Any]]:
    """Measure the memory a block of code allocates, and its peak.

    Yields a dict that is filled in when the block ends (also when it raises):

    - ``allocated_delta``: bytes still allocated at the end minus at the start;
    - ``peak_delta``: the peak during the block minus the bytes allocated at the start;
    - ``reserved_delta``: CUDA: the caching allocator's reserve; CPU: resident set size;
    - ``allocated_before/after``, ``peak_allocated``, ``reserved_before/after``,
      ``elapsed_s``, ``label``, ``device`` and ``source`` (``cuda`` or ``cpu``).

    On CUDA the device is synchronised at both ends and its peak statistic is reset at the
    start (so do not nest two trackers on one GPU). On the CPU only tensors created inside
    the block are counted (``allocated_before`` is 0), through a dispatch mode that costs a
    few microseconds per operator.

    Args:
        label: Name for the log line.
        device: Device to watch (default: the current CUDA device if any, else the CPU).
        log: Log one INFO line on ``gpu_training.memory.tracking`` at the end.

    Yields:
        The dict described above.

    Example:
        >>> import torch
        >>> with memory_tracking("alloc", device="cpu", log=False) as tracker:
        ...     kept = torch.zeros(256, 1024)          # 1 MiB, still alive at the end
        ...     scratch = torch.ones(512, 1024) * 2    # 2 MiB (two tensors), then freed
        ...     del scratch
        >>> format_bytes(tracker["allocated_delta"]), format_bytes(tracker["peak_delta"])
        ('1.0 MiB', '5.0 MiB')
    """
    import torch

    dev = (
        torch.device(device)
        if device is not None
        else (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    )
    result: dict[str, Any] = {"label": label, "device": str(dev)}
    started = time.perf_counter()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        reserved_before = torch.cuda.memory_reserved(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        try:
            yield result
        finally:
            torch.cuda.synchronize(dev)
            after = torch.cuda.memory_allocated(dev)
            peak = torch.cuda.max_memory_allocated(dev)
            reserved_after = torch.cuda.memory_reserved(dev)
            result.update(source="cuda")
            _fill(result, before, after, peak, reserved_before, reserved_after, started, log)
        return
    from gpu_training.memory.measure import LiveTensorTracker

    rss_before = _rss_bytes()
    tracker = LiveTensorTracker()
    try:
        with tracker:
            yield result
    finally:
        rss_after = _rss_bytes()
        result.update(source="cpu")
        _fill(
            result,
            0,
            tracker.current_bytes,
            tracker.peak_bytes,
            rss_before,
            rss_after,
            started,
            log,
        )


def _fill(
    result: dict[str, Any],
    before: int,
    after: int,
    peak: int,
    reserved_before: int | None,
    reserved_after: int | None,
    started: float,
    log: bool,
) -> None:
    reserved_delta = (
        reserved_after - reserved_before
        if reserved_before is not None and reserved_after is not None
        else None
    )
    result.update(
        allocated_before=before,
        allocated_after=after,
        allocated_delta=after - before,
        peak_allocated=peak,
        peak_delta=peak - before,
        reserved_before=reserved_before,
        reserved_after=reserved_after,
        reserved_delta=reserved_delta,
        elapsed_s=time.perf_counter() - started,
    )
    if log:
        reserved = "n/a" if reserved_delta is None else format_bytes(reserved_delta)
        logger.info(
            "[%s] allocated %s, peak +%s, reserved %s (%s, %.3f s)",
            result["label"],
            format_bytes(after - before),
            format_bytes(peak - before),
            reserved,
            result["device"],
            result["elapsed_s"],
        )


# --- the OOM flowchart -----------------------------------------------------------------------

_SIZE = r"([\d.]+)\s*(B|KiB|MiB|GiB|TiB)"
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_FIELDS = {
    "tried": rf"Tried to allocate {_SIZE}",
    "capacity": rf"total capacity of {_SIZE}",
    "free": rf"of which {_SIZE} is free",
    "allocated": rf"{_SIZE} is allocated by PyTorch",
    "reserved_unallocated": rf"{_SIZE} is reserved by PyTorch but unallocated",
}

_FIRST = (
    "Reduce the model size, shard it (FSDP / ZeRO: run `gpu-training plan` for the numbers), "
    "or use a GPU with more memory",
)
_FRAGMENTATION = (
    "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (before the first CUDA call)",
    "Pad or truncate inputs to fixed lengths (bucketing by length keeps batches similar)",
)
_GROWTH = (
    "Check for tensor accumulation: log loss.item(), not loss; detach and .cpu() what you keep "
    "across iterations (lists of losses, TensorBoard histograms)",
    "Profile with torch.cuda.memory._record_memory_history() and torch.cuda.memory_snapshot() "
    "around the failing iteration",
    "If one batch is simply larger (longest sequence, largest image), cap it or lower the "
    "per-device batch and raise gradient accumulation",
)
_BY_EFFORT = (
    "Reduce the per-device batch and raise gradient accumulation to keep the global batch",
    "Enable mixed precision (bf16 where supported)",
    "Enable activation checkpointing of the repeated blocks (~60% less activation memory, "
    "~30% more compute)",
    "optimizer.zero_grad(set_to_none=True) so gradients are freed between steps",
)


@dataclass(frozen=True)
class OOMDiagnosis:
    """What the flowchart concluded, what to do, and the numbers it used."""

    step: int
    """The flowchart question that decided: 1 (first iteration), 2 (random iteration),
    3 (same iteration each time), or 0 (one failure past the first: run again to tell 2
    from 3)."""
    cause: str
    actions: tuple[str, ...]
    """In the order to try them."""
    details: tuple[str, ...] = ()
    """Numbers from the error message and the estimate."""

    def __str__(self) -> str:
        lines = [f"cause: {self.cause}"]
        lines += [f"  {d}" for d in self.details]
        lines.append("try, in order:")
        lines += [f"  {i}. {a}" for i, a in enumerate(self.actions, 1)]
        return "\n".join(lines)


def _parse_oom(message: str) -> dict[str, int]:
    found = {}
    for name, pattern in _FIELDS.items():
        match = re.search(pattern, message)
        if match:
            found[name] = round(float(match.group(1)) * _UNITS[match.group(2)])
    return found


def explain_oom(
    failed_at: int | Sequence[int] | None = None,
    *,
    error: BaseException | str | None = None,
    estimate: MemoryEstimate | None = None,
    gpu_memory_bytes: int | None = None,
) -> OOMDiagnosis:
    """Walk the guide's OOM flowchart and say what to do.

    1. First iteration? The model and optimizer (and first activations) do not fit.
    2. A different iteration each run? Fragmentation or variable-length inputs.
    3. The same (later) iteration each run? One batch is too large, or memory grows.

    Args:
        failed_at: The 0-based iteration of the out-of-memory error, or one per run when the
            job was run several times.
        error: The ``torch.OutOfMemoryError`` (or its message): its allocator figures are read
            (memory reserved but unallocated points to fragmentation).
        estimate: A :class:`~gpu_training.memory.MemoryEstimate` of the job, to say whether
            the model state alone or the activations overflow.
        gpu_memory_bytes: The GPU's memory (default: the capacity named in ``error``).

    Returns:
        An :class:`OOMDiagnosis`; ``str()`` of it is a short report.

    Raises:
        ValueError: For a negative iteration.

    Example:
        >>> d = explain_oom([812, 77, 1503])
        >>> d.step, d.cause
        (2, 'out of memory at a different iteration each run: memory fragmentation or variable-length inputs')
        >>> explain_oom(0).step
        1
    """
    runs = [failed_at] if isinstance(failed_at, int) else list(failed_at or [])
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in runs):
        raise ValueError(f"failed_at must be iterations >= 0, got {failed_at!r}")
    figures = _parse_oom(str(error)) if error is not None else {}
    capacity = gpu_memory_bytes or figures.get("capacity")
    details = [f"{name.replace('_', ' ')}: {format_bytes(v)}" for name, v in figures.items()]
    fragmented = (
        "reserved_unallocated" in figures
        and "tried" in figures
        and figures["reserved_unallocated"] >= figures["tried"]
    )
    if fragmented:
        details.append(
            "the allocator holds more free-but-cached memory than the failed request: fragmentation"
        )
    state_overflows = False
    if estimate is not None:
        details.append(
            f"estimate: model state {format_bytes(estimate.model_state)}, activations "
            f"{format_bytes(estimate.activations)}, total {format_bytes(estimate.total)}"
        )
        if capacity is not None:
            state_overflows = estimate.model_state + estimate.overhead > capacity
            if state_overflows:
                details.append(f"the model state alone exceeds the GPU's {format_bytes(capacity)}")

    if runs and all(i == 0 for i in runs):
        actions = list(_FIRST)
        if not state_overflows:
            actions += list(_BY_EFFORT)
        return OOMDiagnosis(
            1,
            "out of memory in the first iteration: the model, its optimizer state and the "
            "first batch's activations do not fit on the GPU",
            tuple(actions),
            tuple(details),
        )
    if len(set(runs)) > 1 or (fragmented and runs):
        return OOMDiagnosis(
            2,
            "out of memory at a different iteration each run: memory fragmentation or "
            "variable-length inputs",
            (*_FRAGMENTATION, "Clear the CUDA cache (clear_cuda_cache()) between phases"),
            tuple(details),
        )
    if len(runs) > 1:
        return OOMDiagnosis(
            3,
            f"out of memory at iteration {runs[0]} in every run: a specific batch is too "
            "large, or memory grows every iteration",
            _GROWTH,
            tuple(details),
        )
    if runs:
        return OOMDiagnosis(
            0,
            f"out of memory at iteration {runs[0]}, after earlier iterations fit: run again: "
            "a different iteration means fragmentation or variable-length inputs, the same "
            "one a large batch or growing memory",
            _GROWTH[:1] + _FRAGMENTATION[:1] + _GROWTH[1:],
            tuple(details),
        )
    return OOMDiagnosis(
        0,
        "out of memory (iteration unknown): the techniques below are ordered by effort",
        _BY_EFFORT + _FRAGMENTATION[:1],
        tuple(details),
    )
