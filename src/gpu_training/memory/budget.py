"""The memory budget: bytes per GPU of model state under each strategy, and the estimate type.

No torch import: this is the arithmetic that :mod:`gpu_training.strategy.choose` and
``gpu-training plan --params ...`` run on any machine. What a model *measures* (activations,
transient peaks) comes from :mod:`gpu_training.memory.measure`; this module only shards it.

The guide's budget for a 1B-parameter model in fp32 with Adam::

    >>> state = model_state_bytes(10**9, "fp32", "adamw")
    >>> format_bytes(state.weights), format_bytes(state.gradients), format_bytes(state.optimizer)
    ('3.7 GiB', '3.7 GiB', '7.5 GiB')
    >>> state.total / 10**9
    16.0
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from gpu_training.config.checks import check_int_argument

__all__ = [
    "DEFAULT_OVERHEAD_BYTES",
    "LAYOUTS",
    "OPTIMIZER_STATE_BYTES",
    "MemoryBudgetError",
    "MemoryEstimate",
    "ModelStateBytes",
    "TransformerShape",
    "cublas_workspace_bytes",
    "format_bytes",
    "model_state_bytes",
    "parse_layout",
    "per_gpu_bytes",
]

OPTIMIZER_STATE_BYTES: dict[str, int] = {
    "adamw": 8,  # two fp32 moments
    "adam": 8,
    "sgd_momentum": 4,  # one fp32 momentum buffer
    "sgd": 0,
}
"""Optimizer state in bytes per parameter (fp32 state)."""

DEFAULT_OVERHEAD_BYTES = 500 * 2**20
"""CUDA context, allocator slack and communication buffers (the guide's "500 MB")."""

CUBLAS_HANDLES_PER_STEP = 2
"""cuBLAS handles a training step uses on one GPU: the forward's thread and autograd's backward
thread each get their own, and torch gives every (handle, stream) pair its own workspace."""


def cublas_workspace_bytes(
    capability_major: int | None, env: Mapping[str, str] | None = None
) -> int:
    """The cuBLAS workspace torch allocates per handle, through the caching allocator.

    These bytes count in ``torch.cuda.max_memory_allocated``, so a step's peak includes them
    (measured on an H200: a small model's fp32 estimate was 73 MiB short before this term).
    torch's rule: ``CUBLAS_WORKSPACE_CONFIG=:SIZE_KiB:COUNT[:SIZE_KiB:COUNT...]`` when set,
    else 32 MiB on Hopper and newer (compute capability 9+) and 8 MiB + 128 KiB before.
    ``None``: the GPU is not known (planning for a GPU elsewhere): Hopper's size.

    Example:
        >>> cublas_workspace_bytes(9, env={}) // 2**20, cublas_workspace_bytes(8, env={})
        (32, 8519680)
        >>> cublas_workspace_bytes(8, env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}) // 2**20
        32
    """
    config = (os.environ if env is None else env).get("CUBLAS_WORKSPACE_CONFIG", "")
    pairs = re.findall(r":(\d+):(\d+)", config)
    if pairs:
        return sum(int(size) * int(count) for size, count in pairs) * 1024
    if capability_major is None or capability_major >= 9:
        return 4096 * 8 * 1024
    return 4096 * 1024 * 2 + 16 * 1024 * 8


LAYOUTS: tuple[str, ...] = ("none", "ddp", "zero1", "zero2", "fsdp", "zero3", "zero3_offload")
"""Where each piece of model state lives, per GPU:

- ``none`` / ``ddp``: everything replicated (DDP's gradients are views of its buckets);
- ``zero1``: optimizer state sharded; ``zero2``: + gradients; ``fsdp`` / ``zero3``: + weights;
- ``zero3_offload``: ZeRO-3 with the optimizer state (and fp32 master weights) in CPU memory.
"""


class MemoryBudgetError(ValueError):
    """A count, size, precision, optimizer or strategy the budget cannot use."""


def _did_you_mean(value: str, choices: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def format_bytes(num_bytes: float) -> str:
    """A byte count for humans: B, KiB, MiB or GiB (GiB is the largest unit, so rows compare).

    Args:
        num_bytes: Bytes; negative values (a delta that freed memory) keep their sign.

    Returns:
        ``"512 B"``, ``"1.5 KiB"``, ``"500.0 MiB"``, ``"80.0 GiB"``, ``"-2.0 GiB"``...

    Example:
        >>> format_bytes(80 * 2**30), format_bytes(500 * 2**20), format_bytes(-1536)
        ('80.0 GiB', '500.0 MiB', '-1.5 KiB')
    """
    sign = "-" if num_bytes < 0 else ""
    value = abs(float(num_bytes))
    if value < 1024:
        return f"{sign}{value:.0f} B"
    for unit, scale in (("KiB", 2**10), ("MiB", 2**20)):
        if value < 1024 * scale:
            return f"{sign}{value / scale:.1f} {unit}"
    return f"{sign}{value / 2**30:.1f} GiB"


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes of model state for the whole model, before any sharding."""

    weights: int
    """Parameters as the forward pass uses them."""

    gradients: int
    """One gradient per trainable parameter."""

    optimizer: int
    """Optimizer state plus, in ZeRO-style mixed precision, the fp32 master copy."""

    @property
    def total(self) -> int:
        """Weights + gradients + optimizer."""
        return self.weights + self.gradients + self.optimizer


def _state_per_param(optimizer: str | int) -> int:
    if isinstance(optimizer, str):
        key = optimizer.lower()
        if key not in OPTIMIZER_STATE_BYTES:
            raise MemoryBudgetError(
                f"unknown optimizer {optimizer!r}{_did_you_mean(key, list(OPTIMIZER_STATE_BYTES))}"
                f"; expected one of {', '.join(OPTIMIZER_STATE_BYTES)} or bytes per parameter"
            )
        return OPTIMIZER_STATE_BYTES[key]
    if isinstance(optimizer, int) and not isinstance(optimizer, bool) and optimizer >= 0:
        return optimizer
    raise MemoryBudgetError(f"optimizer must be a name or bytes per parameter, got {optimizer!r}")


def _check_count(name: str, value: object, minimum: int = 0) -> int:
    return check_int_argument(name, value, minimum, error=MemoryBudgetError)


_PRECISIONS = ("fp32", "bf16", "fp16", "auto")


def _check_precision(precision: object) -> str:
    if precision not in _PRECISIONS:
        raise MemoryBudgetError(
            f"precision must be fp32, bf16, fp16 or auto, got {precision!r}"
            f"{_did_you_mean(str(precision), ('fp32', 'bf16', 'fp16'))}"
        )
    return str(precision)


def model_state_bytes(
    num_params: int, precision: str = "bf16", optimizer: str | int = "adamw"
) -> ModelStateBytes:
    """Weights, gradients and optimizer state of ``num_params`` parameters (ZeRO accounting).

    fp32: 4 + 4 bytes per parameter plus the optimizer state. bf16/fp16 mixed precision:
    2 + 2 bytes plus a 4-byte fp32 master copy and the optimizer state: the same 16 bytes per
    parameter with AdamW: mixed precision saves activation memory and time, not model-state
    memory. (Torch autocast keeps fp32 parameters instead: 4 + 4 + 8, the same total.)

    Args:
        num_params: Parameter count.
        precision: ``fp32``, ``bf16``, ``fp16`` (``auto`` counts as bf16).
        optimizer: A name from :data:`OPTIMIZER_STATE_BYTES` or bytes of state per parameter.

    Returns:
        The three byte counts.

    Raises:
        MemoryBudgetError: For a negative count, an unknown precision or optimizer.

    Example:
        >>> model_state_bytes(10**9, "bf16").total / 10**9
        16.0
    """
    _check_count("num_params", num_params)
    state = _state_per_param(optimizer)
    if _check_precision(precision) == "fp32":
        return ModelStateBytes(4 * num_params, 4 * num_params, state * num_params)
    return ModelStateBytes(2 * num_params, 2 * num_params, (4 + state) * num_params)


def per_gpu_bytes(
    state: ModelStateBytes, num_gpus: int, activation_bytes: int = 0
) -> dict[str, int]:
    """Bytes per GPU of each candidate layout: model state (sharded or not) + activations.

    Example:
        >>> s = ModelStateBytes(weights=4, gradients=4, optimizer=8)
        >>> per_gpu_bytes(s, 2)
        {'ddp': 16, 'zero1': 12, 'zero2': 10, 'fsdp': 8, 'zero3_offload': 4}
    """
    n = _check_count("num_gpus", num_gpus, 1)
    w, g, o, a = state.weights, state.gradients, state.optimizer, activation_bytes
    return {
        "ddp": w + g + o + a,
        "zero1": w + g + math.ceil(o / n) + a,
        "zero2": w + math.ceil((g + o) / n) + a,
        "fsdp": math.ceil((w + g + o) / n) + a,
        "zero3_offload": math.ceil((w + g) / n) + a,
    }


ARCHITECTURES: tuple[str, ...] = ("gpt", "llama")


@dataclass(frozen=True)
class TransformerShape:
    """A decoder-only transformer described by its shape alone (no weights needed).

    ``gpt``: GPT-2/nanoGPT blocks (LayerNorm, GELU MLP of ``4·hidden``, biases, learned
    positions, LM head tied to the embedding). ``llama``: RMSNorm, SwiGLU MLP, no biases,
    rotary positions (no parameters), untied LM head, optional grouped-query attention.

    Example:
        >>> TransformerShape(num_layers=12, hidden_size=768, seq_len=1024).num_params()
        124439808
        >>> TransformerShape(32, 4096, 4096, vocab_size=32000, arch="llama").num_params()
        6738415616
    """

    num_layers: int
    hidden_size: int
    seq_len: int
    num_heads: int | None = None
    """Attention heads (default ``hidden_size // 64``)."""
    vocab_size: int = 50257
    ffn_hidden_size: int | None = None
    """MLP width (default: ``4·hidden`` for gpt; Llama's ``8·hidden/3`` rounded up to 256)."""
    num_kv_heads: int | None = None
    """Key/value heads for grouped-query attention (default: ``num_heads``)."""
    arch: str = "gpt"

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "seq_len", "vocab_size"):
            _check_count(name, getattr(self, name), 1)
        for name in ("num_heads", "ffn_hidden_size", "num_kv_heads"):
            if getattr(self, name) is not None:
                _check_count(name, getattr(self, name), 1)
        if self.arch not in ARCHITECTURES:
            raise MemoryBudgetError(
                f"arch must be one of {', '.join(ARCHITECTURES)}, got {self.arch!r}"
                f"{_did_you_mean(str(self.arch), ARCHITECTURES)}"
            )
        if self.hidden_size % self.heads:
            raise MemoryBudgetError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.heads})"
            )
        if self.heads % self.kv_heads:
            raise MemoryBudgetError(
                f"num_heads ({self.heads}) must be a multiple of num_kv_heads ({self.kv_heads})"
            )

    @property
    def heads(self) -> int:
        """Attention heads."""
        return self.num_heads or max(1, self.hidden_size // 64)

    @property
    def kv_heads(self) -> int:
        """Key/value heads."""
        return self.num_kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        """Width of one head (``Q`` in the FLOPs formula)."""
        return self.hidden_size // self.heads

    @property
    def ffn(self) -> int:
        """MLP width."""
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.arch == "llama":
            return 256 * math.ceil(8 * self.hidden_size / 3 / 256)
        return 4 * self.hidden_size

    def block_params(self) -> int:
        """Parameters of one transformer block."""
        h, f = self.hidden_size, self.ffn
        kv = 2 * self.kv_heads * self.head_dim
        if self.arch == "llama":
            return h * (h + kv) + h * h + 3 * h * f + 2 * h
        return (h * (h + kv) + h + kv) + (h * h + h) + (2 * h * f + f + h) + 4 * h

    def num_params(self) -> int:
        """Parameters of the whole model (a tied embedding counts once)."""
        h, v = self.hidden_size, self.vocab_size
        blocks = self.num_layers * self.block_params()
        if self.arch == "llama":
            return v * h + blocks + h + h * v
        return v * h + self.seq_len * h + blocks + 2 * h

    def flops_per_token(self) -> int:
        """Training FLOPs per token, ``6·N + 12·L·H·Q·T`` (PaLM appendix B, nanoGPT).

        ``N`` counts the weights a token is multiplied by: every parameter except the
        embedding lookups (the tied gpt embedding stays in: it is also the LM head).

        Example:
            >>> s = TransformerShape(num_layers=12, hidden_size=768, seq_len=1024)
            >>> s.flops_per_token() == 6 * (s.num_params() - 1024 * 768) + 12 * 12 * 768 * 1024
            True
        """
        lookup = self.seq_len * self.hidden_size if self.arch == "gpt" else 0
        if self.arch == "llama":
            lookup = self.vocab_size * self.hidden_size  # the input embedding; the head stays
        n = self.num_params() - lookup
        return 6 * n + 12 * self.num_layers * self.heads * self.head_dim * self.seq_len


_ALIASES = {
    "fully_shard": "fsdp",
    "fsdp2": "fsdp",
    "zero-1": "zero1",
    "zero-2": "zero2",
    "zero-3": "zero3",
}


def parse_layout(strategy: str, zero_stage: int | None = None, offload: str | None = None) -> str:
    """The memory layout of a strategy as the toolkit names it (see :data:`LAYOUTS`).

    Args:
        strategy: ``none``, ``ddp``, ``fsdp``, ``deepspeed`` or a layout name (``zero2``...).
        zero_stage: DeepSpeed's ZeRO stage (default 2, the built-in config's).
        offload: DeepSpeed offload: ``none``, ``optimizer`` or ``all`` (stage 3 only here).

    Returns:
        One of :data:`LAYOUTS`.

    Raises:
        MemoryBudgetError: For an unknown strategy, stage or offload mode.

    Example:
        >>> parse_layout("deepspeed", zero_stage=3, offload="optimizer")
        'zero3_offload'
    """
    if not isinstance(strategy, str):
        raise MemoryBudgetError(f"strategy must be a name, got {strategy!r}")
    name = _ALIASES.get(strategy.lower(), strategy.lower())
    if name == "deepspeed":
        stage = 2 if zero_stage is None else zero_stage
        if stage not in (1, 2, 3) or isinstance(stage, bool):
            raise MemoryBudgetError(f"zero_stage must be 1, 2 or 3, got {zero_stage!r}")
        if offload not in (None, "none", "optimizer", "all"):
            raise MemoryBudgetError(f"offload must be none, optimizer or all, got {offload!r}")
        if offload in ("optimizer", "all"):
            if stage != 3:
                raise MemoryBudgetError(
                    f"the estimate models CPU offload with ZeRO stage 3, got stage {stage}"
                )
            return "zero3_offload"
        return f"zero{stage}"
    if name not in LAYOUTS:
        choices = (*LAYOUTS, "deepspeed")
        raise MemoryBudgetError(
            f"unknown strategy {strategy!r}{_did_you_mean(name, choices)}; expected one of "
            f"{', '.join(choices)}"
        )
    return name


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU for one training step, by what uses them.

    ``temporary`` is what the step's peak needs on top of the other four (a backward pass's
    gradient buffers, the optimizer's scratch tensors, gathered FSDP/ZeRO-3 units). When the
    step's peak was measured (``peak``), :attr:`allocated` is that peak: it can be less than
    the sum of the parts, since activations are freed as gradients appear and the two never
    all coexist. Without a measured peak the parts are summed.

    Example:
        >>> e = MemoryEstimate(parameters=4 * 2**30, gradients=4 * 2**30,
        ...                    optimizer_state=8 * 2**30, activations=2**30, temporary=0,
        ...                    overhead=DEFAULT_OVERHEAD_BYTES)
        >>> format_bytes(e.total), e.fits(16 * 2**30), e.fits(24 * 2**30)
        ('17.5 GiB', False, True)
    """

    parameters: int
    """Weights held on this GPU (a shard under FSDP/ZeRO-3)."""

    gradients: int
    """Gradients held on this GPU."""

    optimizer_state: int
    """Optimizer state on this GPU (with ZeRO mixed precision: and the fp32 master weights)."""

    activations: int
    """Tensors saved for backward at this micro-batch (measured with saved-tensor hooks)."""

    temporary: int
    """Transient buffers at the step's peak beyond the four above."""

    overhead: int = 0
    """CUDA context and allocator slack (not seen by ``torch.cuda.max_memory_allocated``)."""

    batch_size: int = 1
    """Micro-batch per GPU the activations are for."""

    strategy: str = "ddp"
    """Layout (see :data:`LAYOUTS`)."""

    world_size: int = 1
    """GPUs the state is sharded over."""

    tensor_parallel: int = 1
    """GPUs each layer is split over (``fsdp`` with tensor parallel: FSDP over the rest)."""

    precision: str = "fp32"
    activation_checkpointing: bool = False
    num_params: int = 0
    """Parameters of the whole model."""

    method: str = ""
    """How the activations were obtained (measured on fake tensors, on a real forward...)."""

    notes: tuple[str, ...] = field(default=())
    """Assumptions worth knowing when reading the numbers."""

    peak: int | None = None
    """The step's measured peak of allocated bytes (without :attr:`overhead`), if known."""

    @property
    def model_state(self) -> int:
        """Parameters + gradients + optimizer state."""
        return self.parameters + self.gradients + self.optimizer_state

    @property
    def parts(self) -> int:
        """Parameters + gradients + optimizer state + activations + temporary."""
        return self.model_state + self.activations + self.temporary

    @property
    def allocated(self) -> int:
        """Peak bytes the caching allocator hands out: compare with ``max_memory_allocated``.

        The measured :attr:`peak` when there is one, else the sum of the parts.
        """
        return self.peak if self.peak is not None else self.parts

    @property
    def total(self) -> int:
        """Everything this GPU needs: :attr:`allocated` + :attr:`overhead`."""
        return self.allocated + self.overhead

    def fits(self, gpu_memory_bytes: int) -> bool:
        """Whether :attr:`total` fits in ``gpu_memory_bytes``."""
        return self.total <= gpu_memory_bytes

    def breakdown(self) -> dict[str, int]:
        """The six components and the total, in bytes."""
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer_state": self.optimizer_state,
            "activations": self.activations,
            "temporary": self.temporary,
            "overhead": self.overhead,
            "total": self.total,
        }

    def table(self) -> str:
        """The breakdown as aligned text lines, one per component.

        Example:
            >>> print(MemoryEstimate(2**30, 2**30, 2**31, 3 * 2**30, 0).table())
            parameters           1.0 GiB
            gradients            1.0 GiB
            optimizer_state      2.0 GiB
            activations          3.0 GiB
            temporary                0 B
            overhead                 0 B
            total                7.0 GiB
        """
        lines = [f"{k:<16}{format_bytes(v):>12}" for k, v in self.breakdown().items()]
        if self.parts > self.allocated:
            lines.append(
                f"(the parts add up to {format_bytes(self.parts + self.overhead)}: activations "
                "are freed as gradients appear, and the step peaks lower)"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: every field, plus ``allocated`` and ``total``."""
        data = asdict(self)
        data["notes"] = list(self.notes)
        data.update(allocated=self.allocated, total=self.total, parts=self.parts)
        return data
