"""Estimate a training step's memory per GPU: measured on fake tensors, then sharded.

:func:`profile_memory` measures a model (or a reference transformer of a given shape) with
:func:`~gpu_training.memory.measure.profile_step` at two small micro-batches, on fake tensors:
activations are the bytes autograd saves for backward, the transient peaks are what a live-
tensor tracker saw. Everything that depends on the batch is linear in it, so two points give
every other batch. :meth:`MemoryProfile.estimate` (:mod:`gpu_training.memory.profile`) then
lays the model state out for a strategy (replicated, ZeRO-1/2/3, FSDP, offload) and world
size. :func:`estimate_memory` does both.

Example:
    >>> from torch import nn
    >>> from gpu_training.memory import format_bytes
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
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gpu_training.memory.budget import (
    OPTIMIZER_STATE_BYTES,
    MemoryBudgetError,
    MemoryEstimate,
    TransformerShape,
)
from gpu_training.memory.measure import (
    BatchFactory,
    LossFn,
    StepSample,
    detect_blocks,
    profile_step,
)
from gpu_training.memory.profile import MemoryProfile, optimizer_scratch_bytes
from gpu_training.memory.reference import lm_loss, reference_transformer

__all__ = ["MemoryProfile", "estimate_memory", "profile_memory"]

_MEASURE_BATCHES = (2, 4)  # two points fix a line; 2, not 1: BatchNorm cannot train on 1


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
    fused: bool = False,
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
        fused: Step the optimizer as ``fused=True`` does (in place, no scratch the size of the
            parameters), as the Trainer does on CUDA; default: torch's default for the device.

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
            shape,
            num_params,
            precision,
            optimizer.lower(),
            dev.type,
            activation_checkpointing,
            fused,
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
        fused=fused,
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
    fused: bool = False,
) -> MemoryProfile:
    notes = list(notes)
    precision = _resolve_precision(precision, device)
    sim_device = device
    if device.type == "cuda" and not torch.cuda.is_available():
        sim_device = torch.device("cpu")
        notes.append("measured with CPU kernels and autocast rules (no CUDA here)")
    foreach = True if device.type == "cuda" and not fused else None
    if fused:
        notes.append("the optimizer steps fused (in place)")
    run: dict[str, Any] = {
        "loss_fn": loss_fn,
        "precision_dtype": _dtype(precision),
        "optimizer": optimizer,
        "device": sim_device,
        "foreach": foreach,
        "fused": fused,
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
        cuda_capability_major=(
            torch.cuda.get_device_capability(sim_device)[0] if sim_device.type == "cuda" else None
        ),
    )


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
    fused: bool = False,
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
        fused=fused,
    )
    extra = shape.num_layers - ref.num_blocks
    total = num_params if num_params is not None else shape.num_params()
    scale = total / ref.num_params
    grads, state = round(ref.gradient_bytes * scale), round(ref.optimizer_bytes * scale)
    # foreach (CUDA) updates every parameter at once: its scratch grows with the model.
    scratch = optimizer_scratch_bytes(ref.samples[-1])
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
