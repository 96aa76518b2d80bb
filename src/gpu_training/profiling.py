"""Size a job to the hardware: the batch-size finder, throughput and MFU, profiler traces.

- :func:`find_max_batch_size` / :func:`make_fits`: the largest batch that really fits;
- :class:`ThroughputMeter`, :func:`flops_per_token`, :func:`peak_tflops`: samples/s,
  tokens/s and model FLOPs utilisation against an A100/H100/H200 peak table;
- :func:`profile_steps`: a ``torch.profiler`` trace of N steps.

Halving activation precision frees memory; :func:`find_max_batch_size` finds the new ceiling
instead of making you guess. It probes ``fits(batch)`` (a forward + backward + optimizer step
that reports False on out-of-memory), doubling from ``min_batch`` until a probe fails, then
bisects between the last success and the first failure. For a monotone ``fits`` the search is
exact, and it takes at most ``2·⌈log₂ b*⌉ + 2`` probes for a largest fitting batch ``b*``.
The answer keeps a safety margin below ``b*``: a batch that barely passes one probe often
runs out of memory once real training churns the allocator.

Example:
    >>> from gpu_training.profiling import find_max_batch_size
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
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpu_training.amp import MixedPrecisionTrainer
from gpu_training.ddp import DistributedContext, move_to_device, unwrap_model

__all__ = [
    "PEAK_TFLOPS",
    "BatchSearchResult",
    "BatchSizeError",
    "ProfileResult",
    "ThroughputMeter",
    "ThroughputStats",
    "find_max_batch_size",
    "flops_per_token",
    "is_out_of_memory",
    "make_fits",
    "peak_tflops",
    "profile_steps",
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


def _check_positive_int(name: str, value: object) -> None:
    # bool is an int subclass: min_batch=True must not pass as 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _validate(fits: object, min_batch: int, max_batch: int, safety_margin: float) -> None:
    if not callable(fits):
        raise TypeError(f"fits must be callable as fits(batch_size) -> bool, got {fits!r}")
    _check_positive_int("min_batch", min_batch)
    _check_positive_int("max_batch", max_batch)
    if min_batch > max_batch:
        raise ValueError(f"min_batch ({min_batch}) must be <= max_batch ({max_batch})")
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
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _check_context(ctx: DistributedContext | None) -> None:
    if ctx is None or not ctx.is_distributed:
        return
    if not (dist.is_available() and dist.is_initialized()):
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
    # NCCL reduces only CUDA tensors; gloo (and the cpu half of "cpu:gloo,cuda:nccl") CPU ones.
    on_cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
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
    trainer = MixedPrecisionTrainer(optimizer, precision=precision, device=device)
    with trainer.autocast():
        loss = loss_fn(module(*inputs), target)
    trainer.backward(loss)
    trainer.step(module.parameters(), micro_step=0)
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
    optimizer step with a fresh optimizer, as :class:`~gpu_training.amp.MixedPrecisionTrainer`
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


# --- throughput and MFU --------------------------------------------------------------------

PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # Dense tensor-core peaks from NVIDIA's datasheets (the "with sparsity" figures halved).
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM5 (HBM3)
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},  # SXM4 and PCIe
}
"""Peak dense TFLOP/s per GPU by device-name fragment and precision; the first fragment found
in ``torch.cuda.get_device_name()`` wins (so the NVL and PCIe variants come first)."""


def flops_per_token(
    num_params: int,
    num_layers: int = 0,
    num_heads: int = 0,
    head_dim: int = 0,
    seq_len: int = 0,
) -> int:
    """Training FLOPs per token: ``6·N + 12·L·H·Q·T`` (PaLM, appendix B; nanoGPT).

    ``N`` weights cost 2 FLOPs per token forward (multiply + add) and 4 backward; attention's
    ``QKᵀ`` and ``AV`` add ``2·2·T·H·Q`` per layer forward, ×3 with the backward. ``N`` should
    leave out pure lookups (position embeddings); a causal mask is not discounted.

    Args:
        num_params: ``N``, the parameters a token is multiplied by.
        num_layers: ``L`` (0 for a model without attention).
        num_heads: ``H``.
        head_dim: ``Q`` = hidden size / heads.
        seq_len: ``T``.

    Returns:
        FLOPs per trained token.

    Example:
        >>> flops_per_token(124_000_000, num_layers=12, num_heads=12, head_dim=64, seq_len=1024)
        857246208
    """
    for name, value in (
        ("num_params", num_params),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("head_dim", head_dim),
        ("seq_len", seq_len),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return 6 * num_params + 12 * num_layers * num_heads * head_dim * seq_len


def peak_tflops(device: str | torch.device | None = None, precision: str = "bf16") -> float | None:
    """Peak dense TFLOP/s of a GPU at a precision, from :data:`PEAK_TFLOPS`.

    Args:
        device: A CUDA device, or a device *name* such as ``"NVIDIA H100 80GB HBM3"``
            (default: the current CUDA device).
        precision: ``bf16``, ``fp16``, ``tf32`` or ``fp32``.

    Returns:
        TFLOP/s, or None for the CPU and GPUs not in the table (pass a peak yourself).

    Example:
        >>> peak_tflops("NVIDIA H100 80GB HBM3", "bf16"), peak_tflops("NVIDIA A100-SXM4-80GB")
        (989.4, 312.0)
        >>> peak_tflops("NVIDIA H100 PCIe"), peak_tflops("Tesla T4") is None
        (756.0, True)
    """
    if precision not in ("bf16", "fp16", "tf32", "fp32"):
        raise ValueError(f"precision must be bf16, fp16, tf32 or fp32, got {precision!r}")
    if isinstance(device, str) and not device.startswith(("cuda", "cpu", "mps", "meta")):
        name = device
    else:
        dev = torch.device(device) if device is not None else None
        if (dev is not None and dev.type != "cuda") or not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name(dev)
    for fragment, peaks in PEAK_TFLOPS.items():
        if fragment in name:
            return peaks[precision]
    return None


_table_peak = peak_tflops  # ThroughputMeter's argument of the same name shadows it


@dataclass(frozen=True)
class ThroughputStats:
    """Rates over one window of :class:`ThroughputMeter`."""

    elapsed_s: float
    steps: int
    samples: int
    tokens: int
    world_size: int
    flops_per_token: float | None
    peak_tflops: float | None

    @property
    def samples_per_s(self) -> float:
        """This rank's samples per second."""
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """This rank's tokens per second."""
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tflops(self) -> float | None:
        """Achieved model TFLOP/s per GPU (None without ``flops_per_token``)."""
        if self.flops_per_token is None:
            return None
        return self.tokens_per_s * self.flops_per_token / 1e12

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: achieved / peak, in [0, 1] (None without a peak)."""
        achieved = self.tflops
        if achieved is None or not self.peak_tflops:
            return None
        return achieved / self.peak_tflops

    def to_metrics(self) -> dict[str, float]:
        """Flat metrics for a log line: per rank and, with ``world_size`` ranks, job-wide."""
        out = {
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "global_samples_per_s": self.samples_per_s * self.world_size,
            "global_tokens_per_s": self.tokens_per_s * self.world_size,
        }
        if self.tflops is not None:
            out["tflops_per_gpu"] = self.tflops
        if self.mfu is not None:
            out["mfu"] = self.mfu
        return out

    def __str__(self) -> str:
        parts = [f"{self.samples_per_s:,.1f} samples/s"]
        if self.tokens:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        if self.tflops is not None:
            parts.append(f"{self.tflops:.2f} TFLOP/s per GPU")
        mfu = self.mfu
        parts.append(f"MFU {mfu:.1%}" if mfu is not None else "MFU n/a (unknown peak)")
        return " | ".join(parts)


class ThroughputMeter:
    """Samples/s, tokens/s and MFU of a training loop, per window between :meth:`compute` calls.

    :meth:`update` only adds counts (no device sync, call it every step);
    :meth:`compute` synchronises CUDA once, divides by the wall time since the window began,
    and starts the next window. Counts are this rank's; with ``world_size`` the job-wide rates
    assume balanced ranks (no collective is issued).

    MFU = tokens/s × ``flops_per_token`` / peak FLOP/s, with ``flops_per_token`` from
    :func:`flops_per_token` (``6·N + 12·L·H·Q·T``) and the peak from :func:`peak_tflops` for
    ``device`` and ``precision`` unless ``peak_tflops`` is given.

    Args:
        flops_per_token: Training FLOPs per token (None: no TFLOP/s or MFU).
        peak_tflops: This GPU's peak, overriding the table (e.g. a throttled or unlisted GPU).
        world_size: Ranks in the job.
        device: Training device (for the CUDA sync and the peak lookup).
        precision: ``bf16``, ``fp16``, ``tf32`` or ``fp32``, for the peak lookup.
        clock: Seconds since an arbitrary origin (tests pass a fake one).

    Example:
        >>> ticks = iter([0.0, 2.0])
        >>> meter = ThroughputMeter(flops_per_token=6e6, peak_tflops=1.0, device="cpu",
        ...                         clock=lambda: next(ticks))
        >>> for _ in range(4):
        ...     meter.update(samples=8, tokens=8 * 128)
        >>> stats = meter.compute()
        >>> stats.samples_per_s, stats.tokens_per_s, round(stats.mfu, 4)
        (16.0, 2048.0, 0.0123)
    """

    def __init__(
        self,
        *,
        flops_per_token: float | None = None,
        peak_tflops: float | None = None,
        world_size: int = 1,
        device: str | torch.device | None = None,
        precision: str = "bf16",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if flops_per_token is not None and not flops_per_token > 0:
            raise ValueError(f"flops_per_token must be > 0, got {flops_per_token!r}")
        if peak_tflops is not None and not peak_tflops > 0:
            raise ValueError(f"peak_tflops must be > 0, got {peak_tflops!r}")
        _check_positive_int("world_size", world_size)
        self.device = (
            torch.device(device)
            if device is not None
            else (
                torch.device("cuda", torch.cuda.current_device())
                if torch.cuda.is_available()
                else torch.device("cpu")
            )
        )
        self.flops_per_token = flops_per_token
        if precision == "fp32" and torch.get_float32_matmul_precision() != "highest":
            precision = "tf32"  # fp32 matmuls run on tensor cores as TF32 when allowed
        table = _table_peak(self.device, precision)
        self.peak_tflops = peak_tflops if peak_tflops is not None else table
        self.world_size = world_size
        self._clock = clock
        self._steps = self._samples = self._tokens = 0
        self._start = self._now()

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the queued kernels are part of the window
        return self._clock()

    def start(self) -> None:
        """Begin a new window now, dropping counts so far (e.g. after warm-up steps)."""
        self._steps = self._samples = self._tokens = 0
        self._start = self._now()

    def update(self, samples: int, tokens: int | None = None) -> None:
        """Count one step of ``samples`` samples (and ``tokens`` tokens)."""
        if samples < 0 or (tokens is not None and tokens < 0):
            raise ValueError(f"counts must be >= 0, got samples={samples}, tokens={tokens}")
        self._steps += 1
        self._samples += samples
        self._tokens += tokens or 0

    def compute(self) -> ThroughputStats:
        """Rates over the window since the last :meth:`compute` (or :meth:`start`), then reset."""
        now = self._now()
        stats = ThroughputStats(
            elapsed_s=now - self._start,
            steps=self._steps,
            samples=self._samples,
            tokens=self._tokens,
            world_size=self.world_size,
            flops_per_token=self.flops_per_token,
            peak_tflops=self.peak_tflops,
        )
        self._steps = self._samples = self._tokens = 0
        self._start = now
        return stats


# --- torch.profiler traces -----------------------------------------------------------------


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
        >>> model = nn.Linear(32, 32)
        >>> with tempfile.TemporaryDirectory() as out:
        ...     result = profile_steps(lambda i: model(torch.randn(8, 32)).sum().backward(),
        ...                            out, steps=2, warmup=1)
        ...     result.trace_path.is_file()
        True
        >>> result.trace_path.name, "aten::" in result.table
        ('trace_rank0.json', True)
    """
    _check_positive_int("steps", steps)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
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
