"""Estimate a training step's memory per GPU: measured on fake tensors, then sharded.

:func:`profile_memory` measures a model (or a reference transformer of a given shape) with
:func:`~gpu_training.memory.measure.profile_step` at two small micro-batches, on fake tensors:
activations are the bytes autograd saves for backward, the transient peaks are what a live-
tensor tracker saw. Everything that depends on the batch is linear in it, so two points give
every other batch. :meth:`MemoryProfile.estimate` then lays the model state out for a strategy
(replicated, ZeRO-1/2/3, FSDP, offload) and world size. :func:`estimate_memory` does both.

Example:
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
    >>> batch = lambda n: (torch.randn(n, 512), torch.randn(n, 512))
    >>> est = estimate_memory(model, make_batch=batch, loss_fn=nn.functional.mse_loss,
    ...                       batch_size=256, device="cpu")
    >>> est.parameters == sum(p.numel() * 4 for p in model.parameters())
    True
    >>> est.optimizer_state - 2 * est.parameters   # AdamW: two moments + 4 step counters
    16
    >>> print(format_bytes(est.activations))   # input, 2 x GELU in/out, output, target
    5.5 MiB
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gpu_training.memory.budget import (
    DEFAULT_OVERHEAD_BYTES,
    OPTIMIZER_STATE_BYTES,
    MemoryBudgetError,
    MemoryEstimate,
    TransformerShape,
    format_bytes,
    parse_layout,
)
from gpu_training.memory.measure import (
    BatchFactory,
    LossFn,
    StepSample,
    detect_blocks,
    profile_step,
)
from gpu_training.memory.reference import lm_loss, reference_transformer

__all__ = ["MemoryProfile", "estimate_memory", "profile_memory"]

_MEASURE_BATCHES = (2, 4)  # two points fix a line; 2, not 1: BatchNorm cannot train on 1
_DEEPSPEED_BUCKET_ELEMS = 500_000_000  # DeepSpeed's default reduce_bucket_size
_SHARDED_GRADS = ("zero2", "fsdp", "zero3", "zero3_offload")
_SHARDED_WEIGHTS = ("fsdp", "zero3", "zero3_offload")


# --- the measured profile --------------------------------------------------------------------


def _backward_peak(
    a: StepSample, b: StepSample, batch: int, grad_divisor: int, extra_blocks: int = 0
) -> int:
    """Peak bytes of forward + backward at ``batch``: the worst moment of the two traces.

    Every tensor alive at a given moment is linear in the batch, so each moment is a line;
    the peak is their maximum, and the moment that wins can change with the batch (a small
    batch peaks where a large one does not), which a line through two peaks would miss.
    With ``extra_blocks``, the last block's forward and backward repeat that many times.
    """
    if not a.trace or len(a.trace) != len(b.trace):
        # Different operator sequences (a batch-dependent kernel choice): a line through peaks.
        peak = _line(a.backward_peak, b.backward_peak, a.batch_size, b.batch_size, batch)
        then = _line(
            a.grads_at_backward_peak, b.grads_at_backward_peak, a.batch_size, b.batch_size, batch
        )
        return peak + math.ceil(then / grad_divisor)
    f = (batch - a.batch_size) / (b.batch_size - a.batch_size)
    alive = [ca + (cb - ca) * f for (ca, _), (cb, _) in zip(a.trace, b.trace, strict=True)]
    held = [
        (ha + (hb - ha) * f) / grad_divisor
        for (_, ha), (_, hb) in zip(a.trace, b.trace, strict=True)
    ]
    if extra_blocks <= 0:
        return max(0, round(max(x + h for x, h in zip(alive, held, strict=True))))
    m = a.marks
    if len(m.get("fwd_end", ())) < 2 or min(m["fwd_end"][-2:] + m["bwd_start"][-1:]) < 1:
        raise MemoryBudgetError("cannot grow the model: its last two blocks were not traced")
    end_prev, end_last = m["fwd_end"][-2] - 1, m["fwd_end"][-1] - 1
    start_last, bwd_start = m["fwd_start"][-1], m["bwd_start"][-1]
    bwd_end = m["bwd_end"][-1] if m["bwd_end"][-1] > 0 else len(alive)
    kept = extra_blocks * (alive[end_last] - alive[end_prev])  # each block's kept activations
    grads = extra_blocks * (held[bwd_end - 1] - held[bwd_start - 1])  # and its gradients
    best = 0.0
    for t, (x, h) in enumerate(zip(alive, held, strict=True)):
        if t < start_last:  # before the repeated block: unchanged
            value = x + h
        elif t < bwd_start:  # its forward (last copy worst) and everything up to its backward
            value = x + kept + h
        elif t < bwd_end:  # its backward: the first copy keeps the most, the last has all grads
            value = max(x + kept + h, x + h + grads)
        else:  # below it: every extra block's gradients exist, its activations are freed
            value = x + h + grads
        best = max(best, value)
    return max(0, round(best))


def _line(a: int, b: int, xa: int, xb: int, x: int) -> int:
    """The value at ``x`` of the line through ``(xa, a)`` and ``(xb, b)`` (never below 0)."""
    return max(0, round(a + (b - a) * (x - xa) / (xb - xa)))


@dataclass(frozen=True)
class MemoryProfile:
    """A model's memory, measured at two micro-batches; :meth:`estimate` gives any other."""

    num_params: int
    trainable_params: int
    parameter_bytes: int
    """Parameters and buffers, as the model holds them."""
    gradient_bytes: int
    optimizer_bytes: int
    """Optimizer state (on the training device) after one step."""
    block_params: int
    """Parameters of the largest repeated block (an FSDP unit); 0 when there are none."""
    root_params: int
    """Parameters outside the blocks (the FSDP root unit)."""
    num_blocks: int
    samples: tuple[StepSample, StepSample]
    checkpoint_samples: tuple[StepSample, StepSample] | None
    precision: str
    device: str
    method: str
    hidden_size: int | None = None
    notes: tuple[str, ...] = ()
    extra_blocks: int = 0
    """Blocks the model has beyond those measured (a shape is measured with two): each
    repeats the last measured block in the trace."""
    sixteen_bit_samples: tuple[StepSample, StepSample] | None = None
    """The step with 16-bit parameters and no autocast, as FSDP's mixed precision and
    DeepSpeed's bf16 run it (None in fp32, or when measured for real)."""
    sixteen_bit_checkpoint_samples: tuple[StepSample, StepSample] | None = None

    def _pair(
        self, checkpointing: bool, sixteen_bit: bool = False
    ) -> tuple[StepSample, StepSample]:
        if sixteen_bit:
            pair = (
                self.sixteen_bit_checkpoint_samples if checkpointing else self.sixteen_bit_samples
            )
            if pair is not None:
                return pair
        if not checkpointing:
            return self.samples
        if self.checkpoint_samples is None:
            raise MemoryBudgetError(
                "activation checkpointing needs repeated blocks (an nn.ModuleList of same-class "
                "modules) and a profile measured with them; none were found"
            )
        return self.checkpoint_samples

    def activation_bytes(self, batch_size: int, activation_checkpointing: bool = False) -> int:
        """Bytes saved for backward at ``batch_size`` (what checkpointing keeps, if on)."""
        self._pair(activation_checkpointing)  # raises when checkpointing was not measured
        a, b = self.samples
        field = "saved_outside_blocks" if activation_checkpointing else "saved"
        return _line(getattr(a, field), getattr(b, field), a.batch_size, b.batch_size, batch_size)

    def estimate(
        self,
        batch_size: int,
        *,
        strategy: str = "ddp",
        zero_stage: int | None = None,
        offload: str | None = None,
        world_size: int = 1,
        activation_checkpointing: bool = False,
        overhead_bytes: int | None = None,
    ) -> MemoryEstimate:
        """Bytes per GPU at ``batch_size`` under a strategy.

        Args:
            batch_size: Micro-batch per GPU.
            strategy: ``none``, ``ddp``, ``fsdp``, ``deepspeed`` or a layout from
                :data:`~gpu_training.memory.LAYOUTS`.
            zero_stage: DeepSpeed's stage (with ``strategy="deepspeed"``).
            offload: DeepSpeed's offload (``none``, ``optimizer``, ``all``).
            world_size: GPUs sharing the state.
            activation_checkpointing: Recompute each block in backward.
            overhead_bytes: CUDA context and slack (default 500 MiB on CUDA, 0 on the CPU).

        Returns:
            A :class:`~gpu_training.memory.MemoryEstimate`.

        Raises:
            MemoryBudgetError: For a bad batch, world size or strategy, or checkpointing
                without blocks.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise MemoryBudgetError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise MemoryBudgetError(f"world_size must be an integer >= 1, got {world_size!r}")
        layout = parse_layout(strategy, zero_stage, offload)
        n = world_size
        half = self.precision in ("bf16", "fp16")
        # FSDP and DeepSpeed compute with 16-bit copies of the weights, not under autocast.
        sixteen_bit = half and layout not in ("none", "ddp")
        a, b = self._pair(activation_checkpointing, sixteen_bit)
        at = lambda f: _line(getattr(a, f), getattr(b, f), a.batch_size, b.batch_size, batch_size)  # noqa: E731
        acts = at("saved_outside_blocks" if activation_checkpointing else "saved")
        inputs = at("inputs")
        scratch = _scratch(self.samples[-1])  # the optimizer steps on fp32 weights either way

        w, g, o = self.parameter_bytes, self.gradient_bytes, self.optimizer_bytes
        notes = list(self.notes)
        if layout.startswith("zero") and half:
            # DeepSpeed keeps 16-bit weights and gradients, and fp32 masters in the optimizer.
            w, g, o = 2 * self.num_params, 2 * self.trainable_params, 4 * self.trainable_params + o
        copies = 0
        if sixteen_bit and self.sixteen_bit_samples is None:
            # Measured under autocast only: leave out its cached weight copies, the
            # batch-independent part of the saved bytes.
            copies = _line(a.saved, b.saved, a.batch_size, b.batch_size, 0)
            acts = max(0, acts - copies)
        shard = {
            "none": (1, 1, 1),
            "ddp": (1, 1, 1),
            "zero1": (1, 1, n),
            "zero2": (1, n, n),
        }.get(layout, (n, n, n))
        w_s, g_s = math.ceil(w / shard[0]), math.ceil(g / shard[1])
        o_s = 0 if layout == "zero3_offload" else math.ceil(o / shard[2])
        # Activations, transients and the gradients so far, at the worst moment of backward
        # (sharded layouts reduce-scatter each gradient as soon as it is complete).
        divisor = n if layout in _SHARDED_GRADS else 1
        backward = max(0, _backward_peak(a, b, batch_size, divisor, self.extra_blocks) - copies)
        if layout == "zero3_offload":
            scratch = 0  # the optimizer steps on the CPU
        elif shard[2] > 1:
            scratch = math.ceil(scratch / n)
        extra = 0
        if layout in _SHARDED_WEIGHTS and n > 1:
            unit_bytes = 2 if half else 4
            root = self.root_params if self.num_blocks else self.num_params
            # FSDP keeps the root unit gathered through forward and prefetches the next block;
            # a block's unsharded gradient waits (in fp32) for its reduce-scatter.
            extra = unit_bytes * (root + 2 * self.block_params) + 4 * self.block_params
        elif layout in ("zero1", "zero2") and n > 1:
            elems = self.hidden_size**2 if self.hidden_size else _DEEPSPEED_BUCKET_ELEMS
            extra = 2 * min(self.trainable_params, elems) * (2 if half else 4)
        if layout == "ddp":
            notes.append("DDP with gradient_as_bucket_view=True: gradients live in its buckets")
        forward_backward = w_s + o_s + backward + extra
        optimizer_step = w_s + g_s + o_s + scratch + inputs
        peak = max(forward_backward, optimizer_step)
        resident = w_s + g_s + o_s + acts
        if overhead_bytes is None:
            overhead_bytes = DEFAULT_OVERHEAD_BYTES if self.device == "cuda" else 0
        return MemoryEstimate(
            parameters=w_s,
            gradients=g_s,
            optimizer_state=o_s,
            activations=acts,
            temporary=max(0, peak - resident),
            overhead=overhead_bytes,
            batch_size=batch_size,
            strategy=layout,
            world_size=n,
            precision=self.precision,
            activation_checkpointing=activation_checkpointing,
            num_params=self.num_params,
            method=self.method,
            notes=tuple(notes),
            peak=peak,
        )

    def describe(self) -> str:
        """One line: what was measured, and how."""
        a, b = self.samples
        per_sample = (b.saved - a.saved) // (b.batch_size - a.batch_size)
        return (
            f"{self.num_params:,} parameters, {self.precision}, {self.method}; activations "
            f"{format_bytes(per_sample)} per sample"
        )


def _resolve_precision(precision: str, device: torch.device) -> str:
    from gpu_training.amp import resolve_precision

    if device.type == "cuda" and not torch.cuda.is_available():
        # Planning for a GPU from a machine without one: assume Ampere or newer.
        resolved = resolve_precision(precision, "cpu")
        return "bf16" if precision == "auto" else resolved
    return resolve_precision(precision, device)


def _dtype(precision: str) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def profile_memory(
    model: nn.Module | None = None,
    *,
    make_batch: BatchFactory | None = None,
    loss_fn: LossFn | None = None,
    shape: TransformerShape | None = None,
    num_params: int | None = None,
    precision: str = "fp32",
    optimizer: str = "adamw",
    device: str | torch.device | None = None,
    blocks: Sequence[nn.Module] | None = None,
    activation_checkpointing: bool | None = None,
) -> MemoryProfile:
    """Measure a model, or a reference transformer of ``shape``, for :meth:`MemoryProfile.estimate`.

    Activations are measured, not guessed: one step at micro-batches 2 and 4 runs on fake
    tensors (no compute, no memory) with saved-tensor hooks and a live-tensor tracker; a model
    fake tensors cannot trace (data-dependent control flow) is run for real instead, forward
    and backward only.

    Args:
        model: The model (on any device, ``meta`` included). Give this or ``shape``.
        make_batch: ``make_batch(n) -> (*inputs, target)`` for ``model``.
        loss_fn: ``loss_fn(output, target)``; default: mean of the first output.
        shape: A transformer shape, measured on a :func:`reference_transformer` of two
            blocks and extended to ``shape.num_layers`` (every block holds the same).
        num_params: With ``shape``: the real model's parameter count, when it differs from the
            reference's (grouped-query attention, other MLPs).
        precision: ``fp32``, ``bf16``, ``fp16`` or ``auto``.
        optimizer: ``adamw``, ``adam``, ``sgd`` or ``sgd_momentum``.
        device: The training device (default: the model's; ``cuda`` for a shape). On CUDA the
            optimizer is measured with ``foreach=True``, torch's choice there.
        blocks: The repeated blocks (default: detected; see
            :func:`~gpu_training.memory.measure.detect_blocks`).
        activation_checkpointing: Also measure with each block checkpointed (default: when
            blocks exist).

    Returns:
        A :class:`MemoryProfile`.

    Raises:
        MemoryBudgetError: Neither or both of ``model`` and ``shape``; no ``make_batch``.
    """
    if (model is None) == (shape is None):
        raise MemoryBudgetError("give either a model (with make_batch) or a transformer shape")
    if not isinstance(optimizer, str) or optimizer.lower() not in OPTIMIZER_STATE_BYTES:
        raise MemoryBudgetError(
            f"unknown optimizer {optimizer!r}; expected one of {', '.join(OPTIMIZER_STATE_BYTES)}"
        )
    if shape is not None:
        if num_params is not None and (isinstance(num_params, bool) or num_params < 1):
            raise MemoryBudgetError(f"num_params must be an integer >= 1, got {num_params!r}")
        dev = torch.device(device if device is not None else "cuda")
        return _profile_shape(
            shape, num_params, precision, optimizer.lower(), dev.type, activation_checkpointing
        )
    assert model is not None
    if make_batch is None:
        raise MemoryBudgetError("make_batch is required to measure a model's activations")
    return _profile_model(
        model,
        make_batch,
        loss_fn,
        precision=precision,
        optimizer=optimizer.lower(),
        device=_device_of_model(model, device),
        blocks=list(blocks) if blocks is not None else detect_blocks(model),
        activation_checkpointing=activation_checkpointing,
    )


def _profile_model(
    model: nn.Module,
    make_batch: BatchFactory,
    loss_fn: LossFn | None,
    *,
    precision: str,
    optimizer: str,
    device: torch.device,
    blocks: list[nn.Module],
    activation_checkpointing: bool | None,
    notes: Sequence[str] = (),
) -> MemoryProfile:
    notes = list(notes)
    precision = _resolve_precision(precision, device)
    sim_device = device
    if device.type == "cuda" and not torch.cuda.is_available():
        sim_device = torch.device("cpu")
        notes.append("measured with CPU kernels and autocast rules (no CUDA here)")
    foreach = True if device.type == "cuda" else None
    run: dict[str, Any] = {
        "loss_fn": loss_fn,
        "precision_dtype": _dtype(precision),
        "optimizer": optimizer,
        "device": sim_device,
        "foreach": foreach,
        "blocks": blocks,
        "scalars_on_host": device.type == "cuda",
    }
    method = "measured on fake tensors"
    try:
        samples = tuple(profile_step(model, make_batch, n, **run) for n in _MEASURE_BATCHES)
    except Exception as exc:  # any tracing failure: measure for real instead
        if _device_of_model(model, None).type == "meta" or isinstance(exc, MemoryBudgetError):
            raise
        method = "measured on a real forward + backward"
        notes.append(f"fake tensors failed ({type(exc).__name__}: {exc}); measured for real")
        samples = tuple(
            profile_step(model, make_batch, n, fake=False, **run) for n in _MEASURE_BATCHES
        )
    want_ckpt = bool(blocks) and activation_checkpointing is not False
    fake = samples[0].fake

    def measure(**change: Any) -> tuple[StepSample, ...]:
        return tuple(
            profile_step(model, make_batch, n, **{**run, "fake": fake, **change})
            for n in _MEASURE_BATCHES
        )

    ckpt_samples = measure(checkpoint_blocks=True) if want_ckpt else None
    sixteen = sixteen_ckpt = None
    if fake and run["precision_dtype"] is not None:
        as_sharded = {"precision_dtype": None, "param_dtype": run["precision_dtype"]}
        sixteen = measure(**as_sharded)
        sixteen_ckpt = measure(checkpoint_blocks=True, **as_sharded) if want_ckpt else None
    params = {id(p): p for p in model.parameters()}
    block_ids = [{id(p) for p in blk.parameters()} for blk in blocks]
    in_blocks = set().union(*block_ids)
    trainable_bytes = sum(p.numel() * p.element_size() for p in params.values() if p.requires_grad)
    if not samples[0].fake:  # no optimizer step ran: torch keeps its state in the weights' dtype
        state = OPTIMIZER_STATE_BYTES[optimizer] // 4 * trainable_bytes
        scratch = trainable_bytes if foreach else 0
        samples = tuple(_with_state(s, s.gradients, state, scratch) for s in samples)
        if ckpt_samples is not None:
            ckpt_samples = tuple(_with_state(s, s.gradients, state, scratch) for s in ckpt_samples)
    return MemoryProfile(
        num_params=sum(p.numel() for p in params.values()),
        trainable_params=sum(p.numel() for p in params.values() if p.requires_grad),
        parameter_bytes=sum(p.numel() * p.element_size() for p in params.values())
        + sum(b.numel() * b.element_size() for b in model.buffers()),
        gradient_bytes=samples[0].gradients,
        optimizer_bytes=samples[0].optimizer_state,
        block_params=max((sum(params[i].numel() for i in ids) for ids in block_ids), default=0),
        root_params=sum(p.numel() for i, p in params.items() if i not in in_blocks),
        num_blocks=len(blocks),
        samples=samples,  # type: ignore[arg-type]
        checkpoint_samples=ckpt_samples,  # type: ignore[arg-type]
        sixteen_bit_samples=sixteen,  # type: ignore[arg-type]
        sixteen_bit_checkpoint_samples=sixteen_ckpt,  # type: ignore[arg-type]
        precision=precision,
        device=device.type,
        method=method,
        notes=tuple(notes),
    )


def _scratch(sample: StepSample) -> int:
    """The optimizer step's scratch: its peak less gradients, state and the batch."""
    return max(0, sample.optimizer_peak - sample.gradients - sample.optimizer_state - sample.inputs)


def _with_state(sample: StepSample, grads: int, state: int, scratch: int) -> StepSample:
    return dataclasses.replace(
        sample,
        gradients=grads,
        optimizer_state=state,
        optimizer_peak=grads + state + scratch + sample.inputs,
    )


def _grow(sample: StepSample, extra: int) -> StepSample:
    """The saved-byte counts of ``sample`` with ``extra`` more blocks like its last one."""
    blocks = len(sample.saved_per_block)
    per_input = sample.block_inputs // blocks
    return dataclasses.replace(
        sample,
        saved=sample.saved + extra * (sample.saved_per_block[-1] + per_input),
        saved_outside_blocks=sample.saved_outside_blocks + extra * per_input,
        block_inputs=sample.block_inputs + extra * per_input,
    )


@functools.lru_cache(maxsize=32)
def _profile_shape(
    shape: TransformerShape,
    num_params: int | None,
    precision: str,
    optimizer: str,
    device_type: str,
    activation_checkpointing: bool | None,
) -> MemoryProfile:
    """A shape measured on a reference of (at most) two blocks, grown to its depth."""
    seq = shape.seq_len

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.zeros(n, seq, dtype=torch.long)
        return ids, ids

    model = reference_transformer(shape, min(2, shape.num_layers))
    ref = _profile_model(
        model,
        make_batch,
        lm_loss,
        precision=precision,
        optimizer=optimizer,
        device=torch.device(device_type),
        blocks=list(model.get_submodule("blocks").children()),
        activation_checkpointing=activation_checkpointing,
        notes=(f"reference {shape.arch} transformer, vocab {shape.vocab_size}, seq {seq}",),
    )
    extra = shape.num_layers - ref.num_blocks
    total = num_params if num_params is not None else shape.num_params()
    scale = total / ref.num_params
    grads, state = round(ref.gradient_bytes * scale), round(ref.optimizer_bytes * scale)
    # foreach (CUDA) updates every parameter at once: its scratch grows with the model.
    scratch = _scratch(ref.samples[-1])
    scratch = round(scratch * scale) if device_type == "cuda" else scratch

    def grown(pair: tuple[StepSample, StepSample] | None) -> tuple[StepSample, ...] | None:
        if pair is None:
            return None
        return tuple(_with_state(_grow(s, extra), grads, state, scratch) for s in pair)

    return dataclasses.replace(
        ref,
        num_params=total,
        trainable_params=total,
        parameter_bytes=round(ref.parameter_bytes * scale),
        gradient_bytes=grads,
        optimizer_bytes=state,
        num_blocks=shape.num_layers,
        extra_blocks=extra,
        samples=grown(ref.samples),  # type: ignore[arg-type]
        checkpoint_samples=grown(ref.checkpoint_samples),  # type: ignore[arg-type]
        sixteen_bit_samples=grown(ref.sixteen_bit_samples),  # type: ignore[arg-type]
        sixteen_bit_checkpoint_samples=grown(
            ref.sixteen_bit_checkpoint_samples  # type: ignore[arg-type]
        ),
        hidden_size=shape.hidden_size,
    )


def _device_of_model(model: nn.Module, device: str | torch.device | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    for t in (*model.parameters(), *model.buffers()):
        return t.device if t.device.type != "meta" else torch.device("cpu")
    return torch.device("cpu")


def estimate_memory(
    model: nn.Module | None = None,
    *,
    make_batch: BatchFactory | None = None,
    loss_fn: LossFn | None = None,
    shape: TransformerShape | None = None,
    num_params: int | None = None,
    batch_size: int = 1,
    precision: str = "fp32",
    optimizer: str = "adamw",
    activation_checkpointing: bool = False,
    strategy: str = "ddp",
    zero_stage: int | None = None,
    offload: str | None = None,
    world_size: int = 1,
    device: str | torch.device | None = None,
    overhead_bytes: int | None = None,
    blocks: Sequence[nn.Module] | None = None,
) -> MemoryEstimate:
    """Bytes per GPU of one training step: parameters, gradients, optimizer state,
    activations, temporary buffers and framework overhead.

    For a model, activations are measured (see :func:`profile_memory`); for a transformer
    ``shape`` they are measured on a reference transformer of that shape. The model state
    is then laid out for the strategy: replicated (``none``/``ddp``), optimizer state sharded
    (ZeRO-1), + gradients (ZeRO-2), + weights (``fsdp``, ZeRO-3), optimizer offloaded to CPU.

    Args:
        model: The model; or give ``shape`` (and optionally ``num_params``).
        make_batch: ``make_batch(n) -> (*inputs, target)``, required with ``model``.
        loss_fn: ``loss_fn(output, target)``.
        shape: A :class:`~gpu_training.memory.TransformerShape`.
        num_params: With ``shape``: the real parameter count.
        batch_size: Micro-batch per GPU.
        precision: ``fp32``, ``bf16``, ``fp16`` or ``auto``.
        optimizer: ``adamw``, ``adam``, ``sgd`` or ``sgd_momentum``.
        activation_checkpointing: Recompute the repeated blocks in backward.
        strategy: ``none``, ``ddp``, ``fsdp``, ``deepspeed`` or a layout (``zero2``...).
        zero_stage: DeepSpeed's ZeRO stage.
        offload: DeepSpeed's offload.
        world_size: GPUs.
        device: Training device (default: the model's, ``cuda`` for a shape).
        overhead_bytes: Default 500 MiB on CUDA, 0 on the CPU.
        blocks: The repeated blocks (default: detected).

    Returns:
        A :class:`~gpu_training.memory.MemoryEstimate`.

    Raises:
        MemoryBudgetError: For inconsistent or out-of-range arguments.
    """
    profile = profile_memory(
        model,
        make_batch=make_batch,
        loss_fn=loss_fn,
        shape=shape,
        num_params=num_params,
        precision=precision,
        optimizer=optimizer,
        device=device,
        blocks=blocks,
        activation_checkpointing=activation_checkpointing,
    )
    return profile.estimate(
        batch_size,
        strategy=strategy,
        zero_stage=zero_stage,
        offload=offload,
        world_size=world_size,
        activation_checkpointing=activation_checkpointing,
        overhead_bytes=overhead_bytes,
    )
