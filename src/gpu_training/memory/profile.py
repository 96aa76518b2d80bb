"""A model's measured memory, laid out per GPU for a strategy: :class:`MemoryProfile`.

:func:`~gpu_training.memory.estimate.profile_memory` measures a step at two micro-batches;
the profile keeps both samples. Everything that depends on the batch is linear in it, so
:meth:`MemoryProfile.estimate` gives any other batch, then shards the model state for the
strategy (replicated, ZeRO-1/2/3, FSDP, offload) and world size and finds the step's peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpu_training.config.checks import check_int_argument
from gpu_training.memory.budget import (
    CUBLAS_HANDLES_PER_STEP,
    DEFAULT_OVERHEAD_BYTES,
    MemoryBudgetError,
    MemoryEstimate,
    cublas_workspace_bytes,
    format_bytes,
    parse_layout,
)
from gpu_training.memory.measure import StepSample

__all__ = ["MemoryProfile", "optimizer_scratch_bytes"]

_DEEPSPEED_BUCKET_ELEMS = 500_000_000  # DeepSpeed's default reduce_bucket_size
_SHARDED_GRADS = ("zero2", "fsdp", "zero3", "zero3_offload")
_SHARDED_WEIGHTS = ("fsdp", "zero3", "zero3_offload")


def _backward_peak(
    a: StepSample,
    b: StepSample,
    batch: int,
    grad_divisor: int,
    extra_blocks: int = 0,
    alive_divisor: int = 1,
) -> int:
    """Peak bytes of forward + backward at ``batch``: the worst moment of the two traces.

    Every tensor alive at a given moment is linear in the batch, so each moment is a line;
    the peak is their maximum, and the moment that wins can change with the batch (a small
    batch peaks where a large one does not), which a line through two peaks would miss.
    With ``extra_blocks``, the last block's forward and backward repeat that many times.
    ``alive_divisor`` shares every non-gradient tensor out (tensor + sequence parallel).
    """
    if not a.trace or len(a.trace) != len(b.trace):
        # Different operator sequences (a batch-dependent kernel choice): a line through peaks.
        peak = _line(a.backward_peak, b.backward_peak, a.batch_size, b.batch_size, batch)
        then = _line(
            a.grads_at_backward_peak, b.grads_at_backward_peak, a.batch_size, b.batch_size, batch
        )
        return math.ceil(peak / alive_divisor) + math.ceil(then / grad_divisor)
    f = (batch - a.batch_size) / (b.batch_size - a.batch_size)
    alive = [
        (ca + (cb - ca) * f) / alive_divisor
        for (ca, _), (cb, _) in zip(a.trace, b.trace, strict=True)
    ]
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
    cuda_capability_major: int | None = None
    """The measuring GPU's compute capability (major), for its cuBLAS workspace; None when
    none was there (the estimate then assumes Hopper's)."""

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
        tensor_parallel: int = 1,
    ) -> MemoryEstimate:
        """Bytes per GPU at ``batch_size`` under a strategy.

        With ``tensor_parallel=t`` (``fsdp`` only) the layout is 2-D, as torchtitan's: tensor
        parallel over ``t`` GPUs with sequence parallel, FSDP over the ``world_size / t``
        data-parallel groups. The model state is sharded ``t x world_size / t`` ways (as
        FSDP's over ``world_size``), and everything the micro-batch creates (activations,
        transients, FSDP's gathered units) is split ``t`` ways: Korthikanti et al. 2022's
        ``sbh(34 + 5as/h) / t`` per layer, the embedding and loss parallel too. ``batch_size``
        is then a data-parallel group's, which its ``t`` GPUs share.

        Args:
            batch_size: Micro-batch per GPU.
            strategy: ``none``, ``ddp``, ``fsdp``, ``deepspeed`` or a layout from
                :data:`~gpu_training.memory.LAYOUTS`.
            zero_stage: DeepSpeed's stage (with ``strategy="deepspeed"``).
            offload: DeepSpeed's offload (``none``, ``optimizer``, ``all``).
            world_size: GPUs sharing the state.
            activation_checkpointing: Recompute each block in backward.
            overhead_bytes: CUDA context and slack (default 500 MiB on CUDA, 0 on the CPU).
            tensor_parallel: GPUs a layer is split over (1: none); divides ``world_size``.

        Returns:
            A :class:`~gpu_training.memory.MemoryEstimate`.

        Raises:
            MemoryBudgetError: For a bad batch, world size or strategy, or checkpointing
                without blocks.
        """
        check_int_argument("batch_size", batch_size, error=MemoryBudgetError)
        check_int_argument("world_size", world_size, error=MemoryBudgetError)
        check_int_argument("tensor_parallel", tensor_parallel, error=MemoryBudgetError)
        layout = parse_layout(strategy, zero_stage, offload)
        n, t = world_size, tensor_parallel
        if t > 1 and (layout != "fsdp" or n % t):
            raise MemoryBudgetError(
                f"tensor_parallel {t} needs the fsdp layout and a world_size it divides, "
                f"got {layout} over {n}"
            )
        half = self.precision in ("bf16", "fp16")
        # FSDP and DeepSpeed compute with 16-bit copies of the weights, not under autocast.
        sixteen_bit = half and layout not in ("none", "ddp")
        a, b = self._pair(activation_checkpointing, sixteen_bit)
        at = lambda f: _line(getattr(a, f), getattr(b, f), a.batch_size, b.batch_size, batch_size)  # noqa: E731
        acts = at("saved_outside_blocks" if activation_checkpointing else "saved")
        inputs = at("inputs")  # every GPU of a tensor-parallel group reads the whole batch
        scratch = optimizer_scratch_bytes(
            self.samples[-1]
        )  # the optimizer steps on fp32 weights either way

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
        backward = _backward_peak(a, b, batch_size, divisor, self.extra_blocks, t)
        backward = max(0, backward - math.ceil(copies / t))
        acts = math.ceil(acts / t)
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
            extra = math.ceil(extra / t)  # a group gathers its tensor-parallel shard only
        elif layout in ("zero1", "zero2") and n > 1:
            elems = self.hidden_size**2 if self.hidden_size else _DEEPSPEED_BUCKET_ELEMS
            extra = 2 * min(self.trainable_params, elems) * (2 if half else 4)
        if layout == "ddp":
            notes.append("DDP with gradient_as_bucket_view=True: gradients live in its buckets")
        forward_backward = w_s + o_s + backward + extra
        optimizer_step = w_s + g_s + o_s + scratch + inputs
        peak = max(forward_backward, optimizer_step)
        if self.device == "cuda":
            workspace = cublas_workspace_bytes(self.cuda_capability_major)
            peak += CUBLAS_HANDLES_PER_STEP * workspace
            notes.append(
                f"cuBLAS workspaces: {CUBLAS_HANDLES_PER_STEP} x {format_bytes(workspace)} "
                "(the forward's and the backward's threads)"
            )
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
            tensor_parallel=t,
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


def optimizer_scratch_bytes(sample: StepSample) -> int:
    """The optimizer step's scratch: its peak less gradients, state and the batch."""
    return max(0, sample.optimizer_peak - sample.gradients - sample.optimizer_state - sample.inputs)
