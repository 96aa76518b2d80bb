"""Which strategy a model needs: the guide's decision tree, driven by a memory estimate.

The guide's tree::

    fits on 1 GPU?  yes -> DDP (one GPU: no distribution at all)
                    no  -> < 10B params   -> FSDP
                           10B-100B       -> FSDP or DeepSpeed ZeRO-3
                           > 100B         -> DeepSpeed ZeRO-3 + CPU offload

"Fits" is decided from bytes, not guesses: the model state per GPU under each candidate
(replicated, ZeRO-1/2, fully sharded, optimizer offloaded) plus activations, against the GPU's
memory less a fixed overhead. The byte model lives in :mod:`gpu_training.memory` (this module
re-exports :func:`model_state_bytes`, :func:`per_gpu_bytes` and :func:`format_bytes`), and
:func:`choose_strategy` accepts measured per-candidate bytes from
:meth:`gpu_training.memory.MemoryProfile.estimate` in their place (``gpu-training plan`` does).
No torch import::

    >>> choice = choose_strategy(6_740_000_000, gpu_memory_bytes=80 * 2**30, num_gpus=8)
    >>> choice.strategy
    'fsdp'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_training.config.checks import check_int_argument
from gpu_training.memory.budget import (
    DEFAULT_OVERHEAD_BYTES,
    OPTIMIZER_STATE_BYTES,
    MemoryBudgetError,
    ModelStateBytes,
    format_bytes,
    per_gpu_bytes,
)
from gpu_training.memory.budget import model_state_bytes as _model_state_bytes
from gpu_training.strategy.spec import StrategyConfig, StrategyError

__all__ = [
    "CANDIDATES",
    "DEFAULT_OVERHEAD_BYTES",
    "OPTIMIZER_STATE_BYTES",
    "ModelStateBytes",
    "StrategyChoice",
    "choose_strategy",
    "format_bytes",
    "model_state_bytes",
    "per_gpu_bytes",
]

CANDIDATES: tuple[str, ...] = ("ddp", "zero1", "zero2", "fsdp", "zero3_offload")
"""Per-GPU memory is estimated for each: replicated, ZeRO-1, ZeRO-2, fully sharded (FSDP or
ZeRO-3) and ZeRO-3 with the optimizer state (and fp32 master weights) offloaded to CPU."""

_SMALL = 10 * 10**9
_LARGE = 100 * 10**9


def model_state_bytes(
    num_params: int, precision: str = "bf16", optimizer: str | int = "adamw"
) -> ModelStateBytes:
    """Weights, gradients and optimizer state of ``num_params`` parameters.

    :func:`gpu_training.memory.model_state_bytes`, raising :class:`StrategyError` (a
    ``ConfigError``) so a bad strategy input is one CLI line like every other.

    Raises:
        StrategyError: For a negative count, an unknown precision or optimizer.

    Example:
        >>> model_state_bytes(10**9, "fp32").total / 10**9
        16.0
    """
    try:
        return _model_state_bytes(num_params, precision, optimizer)
    except MemoryBudgetError as err:
        raise StrategyError(str(err)) from None


def _count(num_params: int) -> str:
    for scale, unit in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if num_params >= scale:
            return f"{num_params / scale:.3g}{unit}"
    return str(num_params)


@dataclass(frozen=True)
class StrategyChoice:
    """The decision and the numbers behind it."""

    strategy: str
    """``none``, ``ddp``, ``fsdp`` or ``deepspeed``."""

    zero_stage: int | None
    """ZeRO stage for ``deepspeed``, else None."""

    offload: str
    """``none`` or ``optimizer`` (optimizer state and master weights in CPU memory)."""

    fits: bool
    """Whether the chosen layout fits the GPUs at all."""

    num_gpus: int
    usable_bytes: int
    """GPU memory less the fixed overhead."""

    per_gpu_bytes: dict[str, int] = field(default_factory=dict)
    """Estimated bytes per GPU of each candidate (see :data:`CANDIDATES`)."""

    min_gpus: int | None = None
    """When full sharding over ``num_gpus`` does not fit: the GPU count at which it would."""

    reason: str = ""
    """One paragraph with the numbers that decided."""

    def to_strategy_config(self, **options: Any) -> StrategyConfig:
        """This choice as a :class:`StrategyConfig` (extra options passed through)."""
        if self.strategy == "deepspeed":
            options.setdefault("zero_stage", self.zero_stage)
            options.setdefault("offload", self.offload)
        return StrategyConfig(name=self.strategy, **options)


def _check_positive(name: str, value: object, minimum: int) -> int:
    return check_int_argument(name, value, minimum, error=StrategyError)


def choose_strategy(
    num_params: int,
    *,
    gpu_memory_bytes: int,
    num_gpus: int = 1,
    precision: str = "bf16",
    optimizer: str | int = "adamw",
    activation_bytes: int = 0,
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
    state_bytes: ModelStateBytes | None = None,
    candidate_bytes: Mapping[str, int] | None = None,
    fsdp_bytes: Callable[[int], int] | None = None,
) -> StrategyChoice:
    """Apply the guide's decision tree to a memory estimate, and say why.

    1. Replicated state + activations fit one GPU → ``ddp`` (``none`` with one GPU).
    2. Otherwise, with several GPUs, under 100B parameters, when fully sharded state fits →
       ``fsdp`` (10B-100B: the reason names DeepSpeed ZeRO-3 as the equivalent).
    3. Over 100B parameters, or when full sharding does not fit → DeepSpeed ZeRO-3 with the
       optimizer offloaded to CPU; the reason gives the GPU count at which full sharding
       alone would fit, and ``fits`` is False when even offload does not.

    Args:
        num_params: Parameter count.
        gpu_memory_bytes: Memory of one GPU.
        num_gpus: GPUs available.
        precision: ``fp32``, ``bf16`` or ``fp16`` (see :func:`model_state_bytes`).
        optimizer: Optimizer name or state bytes per parameter.
        activation_bytes: Activation memory per GPU for one micro-batch (not sharded).
        overhead_bytes: Memory per GPU that training cannot use.
        state_bytes: A better estimate of the model state, replacing
            :func:`model_state_bytes` (e.g. from a memory profiler).
        candidate_bytes: Measured bytes per GPU of each of :data:`CANDIDATES` (activations
            and temporary buffers included, overhead not), replacing :func:`per_gpu_bytes`;
            e.g. ``{c: profile.estimate(b, strategy=c, world_size=n).allocated ...}``.
        fsdp_bytes: ``fsdp_bytes(k)``: bytes per GPU of full sharding over ``k`` GPUs, to find
            the GPU count at which it fits (default: state / k + the rest of the fsdp figure).

    Returns:
        A :class:`StrategyChoice` with per-GPU bytes of every candidate and the reason.

    Raises:
        StrategyError: For a non-positive count or memory, or an unknown precision/optimizer.

    Example:
        >>> choose_strategy(124_000_000, gpu_memory_bytes=80 * 2**30, num_gpus=8).strategy
        'ddp'
    """
    _check_positive("num_params", num_params, 1)
    _check_positive("gpu_memory_bytes", gpu_memory_bytes, 1)
    n = _check_positive("num_gpus", num_gpus, 1)
    _check_positive("activation_bytes", activation_bytes, 0)
    _check_positive("overhead_bytes", overhead_bytes, 0)
    state = (
        state_bytes
        if state_bytes is not None
        else model_state_bytes(num_params, precision, optimizer)
    )
    usable = gpu_memory_bytes - overhead_bytes
    per_gpu = per_gpu_bytes(state, n, activation_bytes)
    if candidate_bytes is not None:
        missing = [c for c in CANDIDATES if c not in candidate_bytes]
        if missing:
            raise StrategyError(f"candidate_bytes lacks {', '.join(missing)}")
        per_gpu = {c: int(candidate_bytes[c]) for c in CANDIDATES}
    fmt = format_bytes
    head = (
        f"{_count(num_params)} params: weights {fmt(state.weights)} + gradients "
        f"{fmt(state.gradients)} + optimizer {fmt(state.optimizer)} = {fmt(state.total)}, "
        f"activations {fmt(activation_bytes)} per GPU; usable {fmt(usable)} per GPU "
        f"({fmt(gpu_memory_bytes)} - {fmt(overhead_bytes)} overhead)"
    )

    def choice(
        strategy: str,
        stage: int | None,
        offload: str,
        fits: bool,
        why: str,
        min_gpus: int | None = None,
    ) -> StrategyChoice:
        return StrategyChoice(
            strategy, stage, offload, fits, n, usable, per_gpu, min_gpus, f"{head}. {why}"
        )

    if per_gpu["ddp"] <= usable:
        if n == 1:
            return choice(
                "none",
                None,
                "none",
                True,
                f"Replicated state fits one GPU ({fmt(per_gpu['ddp'])} <= "
                f"{fmt(usable)}): single-GPU training, nothing to distribute",
            )
        return choice(
            "ddp",
            None,
            "none",
            True,
            f"Replicated state fits one GPU ({fmt(per_gpu['ddp'])} <= {fmt(usable)}): "
            f"DDP replicates it on {n} GPUs, the fastest option",
        )

    min_gpus = _min_gpus(state, per_gpu["fsdp"], n, usable, fsdp_bytes)
    sharded_fits = n > 1 and per_gpu["fsdp"] <= usable
    why = f"Replicated state does not fit one GPU ({fmt(per_gpu['ddp'])} > {fmt(usable)}). "
    if sharded_fits and num_params <= _LARGE:
        band = (
            "under 10B params: FSDP, PyTorch-native"
            if num_params < _SMALL
            else "10B-100B params: FSDP (or DeepSpeed ZeRO-3, which shards the same way)"
        )
        return choice(
            "fsdp",
            None,
            "none",
            True,
            f"{why}Sharding weights, gradients and optimizer state over {n} GPUs: "
            f"{fmt(per_gpu['fsdp'])} per GPU <= {fmt(usable)}; {band}",
        )

    offload_fits = per_gpu["zero3_offload"] <= usable
    if sharded_fits:  # > 100B and full sharding fits: the guide still adds offload
        why += (
            f"Over 100B params: DeepSpeed ZeRO-3 + CPU offload (the guide's rule), "
            f"{fmt(per_gpu['zero3_offload'])} per GPU; full sharding alone would also fit "
            f"({fmt(per_gpu['fsdp'])} per GPU) and runs faster when host memory is the limit"
        )
        return choice("deepspeed", 3, "optimizer", offload_fits, why)
    if n == 1:
        why += "One GPU: sharding has nothing to spread over. "
    else:
        why += (
            f"Full sharding over {n} GPUs needs {fmt(per_gpu['fsdp'])} per GPU > "
            f"{fmt(usable)}: full sharding alone does not fit. "
        )
    gpus_hint = (
        f"full sharding without offload needs >= {min_gpus} GPUs"
        if min_gpus is not None
        else f"activations alone ({fmt(per_gpu['fsdp'] - math.ceil(state.total / n))}) exceed "
        "the usable memory: reduce the micro-batch or enable activation checkpointing"
    )
    if offload_fits:
        why += (
            f"DeepSpeed ZeRO-3 with the optimizer state offloaded to CPU memory needs "
            f"{fmt(per_gpu['zero3_offload'])} per GPU (fits); or {gpus_hint}"
        )
        return choice("deepspeed", 3, "optimizer", True, why, min_gpus)
    why += (
        f"Even DeepSpeed ZeRO-3 with CPU offload needs {fmt(per_gpu['zero3_offload'])} per GPU: "
        f"does not fit; {gpus_hint}"
    )
    return choice("deepspeed", 3, "optimizer", False, why, min_gpus)


def _min_gpus(
    state: ModelStateBytes,
    fsdp_at_n: int,
    n: int,
    usable: int,
    fsdp_bytes: Callable[[int], int] | None,
) -> int | None:
    """The fewest GPUs over which full sharding fits, or None if no count does."""
    if fsdp_bytes is None:
        fixed = fsdp_at_n - math.ceil(state.total / n)  # activations etc.: not sharded
        room = usable - fixed
        return math.ceil(state.total / room) if room > 0 else None
    # Monotone in k: double until it fits (or clearly never will), then bisect.
    high = 1
    while fsdp_bytes(high) > usable:
        if high > 2**20:
            return None
        high *= 2
    low = high // 2  # does not fit (or 0)
    while high - low > 1:
        middle = (low + high) // 2
        if fsdp_bytes(middle) <= usable:
            high = middle
        else:
            low = middle
    return high
