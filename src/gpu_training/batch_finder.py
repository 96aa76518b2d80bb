"""The batch-size finder: :func:`find_max_batch_size` / :func:`make_fits`, the largest batch
that really fits.

The guides import it as :mod:`gpu_training.profiling`, which re-exports it beside the
throughput meter (:mod:`gpu_training.throughput`) and the tracer (:mod:`gpu_training.traces`).

Halving activation precision frees memory; :func:`find_max_batch_size` finds the new ceiling
instead of making you guess. It probes ``fits(batch)`` (a forward + backward + optimizer step
that reports False on out-of-memory), doubling from ``min_batch`` until a probe fails, then
bisects between the last success and the first failure. For a monotone ``fits`` the search is
exact, and it takes at most ``2·⌈log₂ b*⌉ + 2`` probes for a largest fitting batch ``b*``.
The answer keeps a safety margin below ``b*``: a batch that barely passes one probe often
runs out of memory once real training churns the allocator.

Example:
    >>> from gpu_training.batch_finder import find_max_batch_size
    >>> find_max_batch_size(lambda batch: batch <= 100, max_batch=1024, safety_margin=0.85)
    85

Under ``torch.distributed`` every rank must call the finder; each probe's verdict is agreed
across ranks (a batch fits only if it fits everywhere), so all ranks issue the same probes and
return the same number.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpu_training.amp import MixedPrecisionStepper
from gpu_training.config.checks import check_positive_int_argument
from gpu_training.ddp import DistributedContext, move_to_device, process_group_up, unwrap_model
from gpu_training.process_group import collective_device

__all__ = [
    "BatchSearchResult",
    "BatchSizeError",
    "find_max_batch_size",
    "is_out_of_memory",
    "make_fits",
    "margin_ceiling",
    "per_device_batch_for_share",
    "release_cached_memory",
    "search_max_batch_size",
]

logger = logging.getLogger(__name__)

# --- out-of-memory detection ---------------------------------------------------------------

# CUDA/MPS/XPU raise "... out of memory"; the CPU allocator says "can't allocate memory".
_OOM_MESSAGES = ("out of memory", "can't allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocator out-of-memory error (any device).

    Args:
        exc: The exception to classify.

    Returns:
        True for :class:`torch.OutOfMemoryError` and for a ``RuntimeError`` whose message
        is an allocator failure (``"out of memory"``, ``"can't allocate memory"``).

    Example:
        >>> is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
        True
        >>> is_out_of_memory(ValueError("out of memory"))
        False
    """
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    message = str(exc).lower()
    return any(text in message for text in _OOM_MESSAGES)


def release_cached_memory() -> None:
    """Collect garbage and return the CUDA caching allocator's free blocks to the driver.

    Called after a failed probe so the next one starts from a clean allocator rather than a
    fragmented one left by the failure.
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- batch-size finder ---------------------------------------------------------------------


class BatchSizeError(RuntimeError):
    """Even the smallest batch asked for does not fit in memory."""


@dataclass(frozen=True)
class BatchSearchResult:
    """What :func:`search_max_batch_size` found and how.

    Attributes:
        best_fitting: The largest batch in ``[min_batch, max_batch]`` whose probe passed (b*).
        recommended: ``max(min_batch, floor(safety_margin × best_fitting))``: the batch to use.
        probes: Every probe in order, as ``(batch, fits)`` (the verdict agreed by all ranks).
        safety_margin: The margin applied to ``best_fitting``.
        max_batch: The search ceiling.
    """

    best_fitting: int
    recommended: int
    probes: tuple[tuple[int, bool], ...]
    safety_margin: float
    max_batch: int

    @property
    def num_probes(self) -> int:
        """How many times ``fits`` was called."""
        return len(self.probes)

    @property
    def hit_max_batch(self) -> bool:
        """True when ``max_batch`` itself fit: memory may allow more than was searched."""
        return self.best_fitting == self.max_batch


def _validate(fits: object, min_batch: int, max_batch: int, safety_margin: float) -> None:
    if not callable(fits):
        raise TypeError(f"fits must be callable as fits(batch_size) -> bool, got {fits!r}")
    check_positive_int_argument("min_batch", min_batch)
    check_positive_int_argument("max_batch", max_batch)
    if min_batch > max_batch:
        raise ValueError(f"min_batch ({min_batch}) must be <= max_batch ({max_batch})")
    _check_margin(safety_margin)


def _check_margin(safety_margin: float) -> None:
    if (
        isinstance(safety_margin, bool)
        or not isinstance(safety_margin, (int, float))
        or not math.isfinite(safety_margin)
        or not 0 < safety_margin <= 1
    ):
        raise ValueError(f"safety_margin must be a number in (0, 1], got {safety_margin!r}")


def _apply_margin(best: int, safety_margin: float, min_batch: int) -> int:
    # Exact decimal arithmetic: 0.29 * 100 is 28.999999999999996 in binary floating point.
    return max(min_batch, math.floor(Fraction(str(float(safety_margin))) * best))


def _group_is_active() -> bool:
    return process_group_up() and dist.get_world_size() > 1


def _check_context(ctx: DistributedContext | None) -> None:
    if ctx is None or not ctx.is_distributed:
        return
    if not process_group_up():
        # Without a process group each rank would settle on its own, different batch.
        raise RuntimeError(
            f"ctx describes {ctx.world_size} ranks but torch.distributed is not initialised; "
            "call init_distributed() before find_max_batch_size()"
        )
    if dist.get_world_size() != ctx.world_size:
        raise ValueError(
            f"ctx.world_size is {ctx.world_size} but the process group has "
            f"{dist.get_world_size()} ranks"
        )


_FITS, _NO_FIT, _ERROR = 1, 0, -1


def _run_probe(fits: Callable[[int], bool], batch: int) -> tuple[int, Exception | None]:
    """Calls ``fits(batch)``; returns (status, the exception to re-raise or None)."""
    try:
        verdict = fits(batch)
        if verdict is None:
            raise TypeError(f"fits({batch}) returned None; it must return True or False")
        return (_FITS if verdict else _NO_FIT), None
    except Exception as exc:
        if not is_out_of_memory(exc):
            return _ERROR, exc
    # Past the except block the traceback (and the tensors its frames hold) is released.
    release_cached_memory()
    return _NO_FIT, None


def _agree(status: int, batch: int) -> int:
    """The minimum status over all ranks, raising on every rank if any rank's probe raised."""
    if not _group_is_active():
        return status
    rank, world = dist.get_rank(), dist.get_world_size()
    device = collective_device()
    failing_rank = rank if status == _ERROR else world
    flags = torch.tensor([status, failing_rank], dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    agreed, first_failing = (int(v) for v in flags.tolist())
    if agreed == _ERROR and status != _ERROR:
        # The failing rank re-raises its own error; the others must not wait in a collective.
        raise RuntimeError(
            f"the batch-size probe at batch {batch} raised on rank {first_failing}; "
            "see that rank's traceback"
        )
    return agreed


def _oom_at_min_message(min_batch: int) -> str:
    return (
        f"even min_batch={min_batch} does not fit in memory. Options: enable activation "
        "checkpointing (torch.utils.checkpoint), keep a small per-device batch and raise "
        "gradient accumulation for a larger effective batch, shard the model (FSDP/ZeRO), or "
        "use a smaller model / shorter sequence length."
    )


def search_max_batch_size(
    fits: Callable[[int], bool],
    min_batch: int = 1,
    max_batch: int = 1024,
    safety_margin: float = 0.85,
    *,
    ctx: DistributedContext | None = None,
) -> BatchSearchResult:
    """Find the largest batch that fits, and report how the search went.

    Doubling from ``min_batch`` until a probe fails (or ``max_batch`` fits), then bisection
    between the last success and the first failure. Exact for a monotone ``fits``; at most
    ``2·⌈log₂ b*⌉ + 2`` probes for ``min_batch=1``. An out-of-memory error raised inside
    ``fits`` counts as "does not fit" (the CUDA cache is emptied before the next probe); any
    other exception propagates.

    Args:
        fits: ``fits(batch) -> bool``: run one training step at this batch size and say
            whether it fit (see :func:`make_fits`).
        min_batch: Smallest batch to consider; raises if it does not fit.
        max_batch: Largest batch to probe.
        safety_margin: Fraction of the largest fitting batch to recommend, in (0, 1].
        ctx: The distributed context. Every rank must call this function; with an initialised
            process group each verdict is the minimum over ranks, so all ranks agree.

    Returns:
        A :class:`BatchSearchResult`.

    Raises:
        BatchSizeError: If ``min_batch`` does not fit (on every rank, when distributed).
        ValueError: For a non-positive or inverted batch range or a margin outside (0, 1].
        TypeError: If ``fits`` is not callable or returns None.
        RuntimeError: On the other ranks, when ``fits`` raised a non-OOM error on one rank
            (that rank re-raises its own error).

    Example:
        >>> result = search_max_batch_size(lambda b: b <= 48, max_batch=256, safety_margin=0.9)
        >>> result.best_fitting, result.recommended, result.num_probes
        (48, 43, 12)
    """
    _validate(fits, min_batch, max_batch, safety_margin)
    _check_context(ctx)
    probes: list[tuple[int, bool]] = []

    def probe(batch: int) -> bool:
        status, error = _run_probe(fits, batch)
        agreed = _agree(status, batch)
        if error is not None:
            raise error
        probes.append((batch, agreed == _FITS))
        logger.debug("batch-size probe %d: %s", batch, "fits" if agreed == _FITS else "OOM")
        return agreed == _FITS

    if not probe(min_batch):
        raise BatchSizeError(_oom_at_min_message(min_batch))
    fitting, failing = min_batch, None  # largest known fit, smallest known failure
    while failing is None and fitting < max_batch:
        batch = min(2 * fitting, max_batch)
        if probe(batch):
            fitting = batch
        else:
            failing = batch
    if failing is not None:
        while failing - fitting > 1:
            middle = (fitting + failing) // 2
            if probe(middle):
                fitting = middle
            else:
                failing = middle
    return BatchSearchResult(
        best_fitting=fitting,
        recommended=_apply_margin(fitting, safety_margin, min_batch),
        probes=tuple(probes),
        safety_margin=safety_margin,
        max_batch=max_batch,
    )


def find_max_batch_size(
    fits: Callable[[int], bool],
    min_batch: int = 1,
    max_batch: int = 1024,
    safety_margin: float = 0.85,
    *,
    ctx: DistributedContext | None = None,
) -> int:
    """The batch size to train with: ``floor(safety_margin × largest fitting batch)``.

    Same search as :func:`search_max_batch_size`, returning only the recommendation. Leave
    the margin: a batch that barely passes a single probe often runs out of memory once real
    training churns the allocator (fragmentation, cuDNN workspaces, autograd's peak).

    Args:
        fits: ``fits(batch) -> bool``; out-of-memory errors inside it count as False.
        min_batch: Smallest batch to consider; raises if it does not fit.
        max_batch: Largest batch to probe.
        safety_margin: Fraction of the largest fitting batch to return, in (0, 1].
        ctx: The distributed context; all ranks call this and get the same answer.

    Returns:
        ``max(min_batch, floor(safety_margin × b*))`` for the largest fitting batch ``b*``.

    Raises:
        BatchSizeError: If ``min_batch`` does not fit: use activation checkpointing, gradient
            accumulation, or a smaller model / shorter sequence.
        ValueError: For bad arguments.

    Example:
        >>> model = nn.Linear(8, 2)
        >>> fits = make_fits(model, lambda b: (torch.randn(b, 8), torch.randint(2, (b,))),
        ...                  nn.functional.cross_entropy, precision="fp32")
        >>> find_max_batch_size(fits, min_batch=1, max_batch=64, safety_margin=0.85)
        54
    """
    result = search_max_batch_size(fits, min_batch, max_batch, safety_margin, ctx=ctx)
    return result.recommended


# --- a job's global batch ----------------------------------------------------------------


def margin_ceiling(batch: int, safety_margin: float = 0.85) -> int:
    """The smallest search ceiling at which ``batch`` can be recommended with the margin kept.

    That is the least ``b`` with ``floor(safety_margin × b) >= batch``: when a search up to
    ``b`` finds that ``b`` fits, ``batch`` fits with the margin's headroom, and searching
    further only measures batches the job cannot use.

    Raises:
        ValueError: For a non-positive ``batch`` or a margin outside (0, 1].

    Example:
        >>> margin_ceiling(16, 0.85)  # floor(0.85 x 19) = 16, floor(0.85 x 18) = 15
        19
    """
    check_positive_int_argument("batch", batch)
    _check_margin(safety_margin)
    return math.ceil(batch / Fraction(str(float(safety_margin))))


def per_device_batch_for_share(share: int, recommended: int) -> int:
    """The per-device batch for one rank's ``share`` of a job's global batch.

    The whole share when it is at most ``recommended`` (the margin-kept batch that fits, a
    :attr:`BatchSearchResult.recommended`): no accumulation, and a larger per-device batch is
    of no use to the job, whose global batch is fixed. Otherwise the largest divisor of
    ``share`` not above ``recommended``, so that ``share // batch`` accumulation steps make up
    the share exactly.

    Raises:
        ValueError: For a non-positive argument.

    Example:
        >>> per_device_batch_for_share(16, recommended=3481)
        16
        >>> per_device_batch_for_share(16, recommended=13)  # 16 = 8 x 2 accumulation steps
        8
        >>> per_device_batch_for_share(12, recommended=5)
        4
    """
    check_positive_int_argument("share", share)
    check_positive_int_argument("recommended", recommended)
    if share <= recommended:
        return share
    small = [d for d in range(1, math.isqrt(share) + 1) if share % d == 0]
    return max(d for d in (*small, *(share // d for d in small)) if d <= recommended)


# --- a ready-made probe --------------------------------------------------------------------

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def _module_device(module: nn.Module) -> torch.device:
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def _train_step(
    module: nn.Module,
    batch: Sequence[Any],
    loss_fn: Callable[..., torch.Tensor],
    optimizer: torch.optim.Optimizer,
    precision: str,
    device: torch.device,
) -> None:
    """One full training step; its frame (and every activation) dies when it returns/raises."""
    *inputs, target = move_to_device(tuple(batch), device)
    stepper = MixedPrecisionStepper(optimizer, precision=precision, device=device)
    with stepper.autocast():
        loss = loss_fn(module(*inputs), target)
    stepper.backward(loss)
    stepper.step(module.parameters(), micro_step=0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # CUDA is asynchronous: an OOM may surface only here


def make_fits(
    model: nn.Module,
    make_batch: Callable[[int], Sequence[Any]],
    loss_fn: Callable[..., torch.Tensor],
    optimizer_factory: OptimizerFactory = torch.optim.AdamW,
    precision: str = "auto",
) -> Callable[[int], bool]:
    """Build a ``fits(batch) -> bool`` probe that runs one real training step.

    Each call builds a fresh batch with ``make_batch(batch)``, moves its tensors to the
    model's device, and runs forward (under the precision's autocast), backward and an
    optimizer step with a fresh optimizer, as :class:`~gpu_training.amp.MixedPrecisionStepper`
    would in training, so optimizer state and gradients count toward the peak. Afterwards the
    gradients and optimizer state are dropped and the model's parameters, buffers and
    train/eval mode are restored, so probing neither leaks memory nor changes the model.

    Call it on the bare model before wrapping it in DDP (a wrapped model is unwrapped): a
    probe that runs out of memory on one rank only must not leave the other ranks waiting in
    DDP's gradient all-reduce. DDP's own buckets (~25 MB) are what the safety margin is for.
    A model with BatchNorm cannot train on one sample: search from ``min_batch=2``.

    Args:
        model: The model to probe (on its training device).
        make_batch: ``make_batch(batch) -> (*inputs, target)``: the last element is the
            target, the others are passed to ``model(*inputs)``.
        loss_fn: ``loss_fn(output, target) -> scalar tensor``.
        optimizer_factory: Builds the training optimizer from parameters (default AdamW, whose
            two state tensors per parameter are a large part of the peak).
        precision: ``"auto"``, ``"fp32"``, ``"fp16"`` or ``"bf16"``: probe with the precision
            you will train with, since it changes activation memory.

    Returns:
        ``fits(batch) -> bool``: False when the step ran out of memory; other errors propagate.

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        >>> fits = make_fits(model, lambda b: (torch.randn(b, 8), torch.randint(3, (b,))),
        ...                  nn.functional.cross_entropy, precision="fp32")
        >>> fits(32)
        True
    """
    module = unwrap_model(model)

    def fits(batch_size: int) -> bool:
        device = _module_device(module)
        # CPU copy so the snapshot does not count against the device memory being probed.
        snapshot = {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
        was_training = module.training
        optimizer = optimizer_factory(module.parameters())
        out_of_memory = False
        try:
            module.train()
            _train_step(module, make_batch(batch_size), loss_fn, optimizer, precision, device)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            out_of_memory = True
        finally:
            optimizer.zero_grad(set_to_none=True)
            optimizer.state.clear()
            del optimizer
            module.zero_grad(set_to_none=True)
            module.load_state_dict(snapshot)
            module.train(was_training)
        if out_of_memory:
            release_cached_memory()
        return not out_of_memory

    return fits
