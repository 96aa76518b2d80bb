"""One optimizer step over a global batch: the same math on any number of ranks.

:func:`train_step` runs the ``A`` micro-batches one rank holds of a global batch and makes
the gradient it applies independent of how the global batch is split. The Trainer and the
guides' own loop (:func:`gpu_training.ddp.train_one_epoch`) both step through it, with the
strategy's :class:`StepFns` (:func:`step_fns` for a DDP, FSDP2 or plain model and its
:class:`~gpu_training.amp.MixedPrecisionStepper`):

- **Randomness belongs to the sample.** Each micro-batch's forward and backward draw from
  :func:`~gpu_training.rng.micro_batch_rng` keyed by (seed, step, the micro-batch's index in
  the global batch), so dropout masks do not depend on the rank that computes them.
- **The loss is normalized over the global batch.** A loss that returns ``(sum, count)`` —
  the sum over scored targets and how many there are, e.g. with padding or prompt tokens
  masked by an ignore index — is divided by the number of scored targets of the *whole*
  global batch (all micro-batches, all ranks), counted before the step with one small
  all-reduce. A mean per micro-batch would weight tokens by ``1 / (tokens in their
  micro-batch)``, which changes with the split: the gradient-accumulation bug the Hugging
  Face Trainer fixed in 2024 by passing ``num_items_in_batch``. A loss that returns a mean
  keeps working, exactly as before (its micro-batches all hold ``B`` samples).

:func:`sum_and_count` turns either kind of loss into a (sum, count) pair for evaluation.

The default loss of user tasks is :func:`~gpu_training.tasks.cross_entropy_sum`.

Example:
    >>> import torch
    >>> from gpu_training.tasks import cross_entropy_sum
    >>> logits, targets = torch.zeros(2, 3, 4), torch.tensor([[1, 2, -100], [3, -100, -100]])
    >>> total, count = sum_and_count(cross_entropy_sum(logits, targets), targets)
    >>> int(count), round(float(total / count), 4)  # ln 4 per scored target
    (3, 1.3863)
    >>> [len(group) for group in step_batches(range(7), 3)]  # the short tail is dropped
    [3, 3]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gpu_training.amp import GradNorm, MixedPrecisionStepper, should_step
from gpu_training.ddp import (
    DistributedContext,
    gradient_sync,
    move_to_device,
    process_group_up,
    reduce_scalar_dict,
)
from gpu_training.rng import micro_batch_rng
from gpu_training.tasks import count_scored
from gpu_training.telemetry import OFF, TelemetryOff

__all__ = [
    "LossOutput",
    "StepFns",
    "global_count",
    "global_scale",
    "step_batches",
    "step_fns",
    "sum_and_count",
    "train_step",
]

LossOutput = Tensor | tuple[Tensor, Tensor]
"""A 0-d micro-batch mean, or ``(sum over scored targets, their count)``."""


_SYNCING: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
"""Reusable no-op: most micro-steps cost no context-manager generator (it shows on tiny models)."""


@dataclass(frozen=True)
class StepFns:
    """The four moves of a micro-step, the same for every strategy.

    ``sync(micro_step)`` wraps forward and backward (DDP/FSDP skip the gradient sync off the
    accumulation boundary), ``autocast()`` wraps the forward pass, ``backward(loss)`` takes
    the micro-batch's loss (division by the accumulation steps happens inside; it may return the loss detached, to keep), and
    ``step(micro_step)`` steps the optimizer on a boundary, returning the gradient norm
    before clipping, or None off a boundary. ``step_async`` does the same and returns the
    norm as a :class:`~gpu_training.amp.GradNorm` without waiting for the device, measured
    only if clipping needs it or it is read (read it every N steps, before the next forward).
    """

    sync: Callable[[int], contextlib.AbstractContextManager[Any]]
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]
    backward: Callable[[torch.Tensor], torch.Tensor | None]
    step: Callable[[int], float | None]
    step_async: Callable[[int], GradNorm | None]


def step_fns(model: nn.Module, stepper: MixedPrecisionStepper) -> StepFns:
    """:class:`StepFns` for a wrapped model and its stepper.

    Args:
        model: The wrapped model (DDP, FSDP2 module or plain:
            :func:`~gpu_training.strategy.wrap_model`, or your own ``DDP(model)``).
        stepper: Holds the optimizer, precision, accumulation and clipping.
    """
    accum = stepper.grad_accum_steps

    def sync(micro_step: int) -> contextlib.AbstractContextManager[Any]:
        if should_step(micro_step, accum):
            return _SYNCING  # the boundary micro-step syncs as usual: nothing to switch off
        return gradient_sync(model, enabled=False)

    def step(micro_step: int) -> float | None:
        return stepper.step(model.parameters(), micro_step, names=model.named_parameters)

    def step_async(micro_step: int) -> GradNorm | None:
        return stepper.step_async(model.parameters(), micro_step, names=model.named_parameters)

    return StepFns(
        sync=sync,
        autocast=stepper.autocast,
        backward=stepper.backward,
        step=step,
        step_async=step_async,
    )


def sum_and_count(output: LossOutput, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Any loss's output as ``(sum, count)``: a mean counts the micro-batch's samples.

    Args:
        output: What the loss returned: a 0-d mean, or ``(sum, count)``.
        targets: The micro-batch's targets (their first dimension is the sample count).

    Returns:
        ``(sum, count)`` such that ``sum / count`` is the micro-batch's loss.
    """
    if isinstance(output, tuple):
        return output[0], output[1]
    n = targets.shape[0] if targets.dim() else 1
    return output * n, torch.tensor(n)


def step_batches(loader: Iterable[Any], accumulation: int) -> Iterator[list[Any]]:
    """The loader's micro-batches grouped by optimizer step (``accumulation`` at a time).

    The global-batch sampler yields whole steps only; a short tail is dropped.
    """
    group: list[Any] = []
    for batch in loader:
        group.append(batch)
        if len(group) == accumulation:
            yield group
            group = []


def train_step(
    batches: Sequence[Any],
    model: nn.Module,
    loss_fn: Callable[[Any, Any], LossOutput],
    steps: Any,
    *,
    ctx: DistributedContext,
    device: torch.device,
    seed: int,
    step: int,
    count_fn: Callable[[Tensor], Tensor] = count_scored,
    check_counts: bool = False,
    telemetry: TelemetryOff = OFF,
) -> tuple[GradNorm | None, list[Tensor]]:
    """Forward and backward of this rank's micro-batches of one global batch, then the step.

    Args:
        batches: This rank's ``A`` micro-batches of ``(inputs, targets)`` (on the CPU or the
            device), in the sampler's order.
        model: The wrapped model.
        loss_fn: ``loss_fn(model(inputs), targets)``: a 0-d mean, or ``(sum, count)``.
        steps: The strategy's step functions (``sync``, ``autocast``, ``backward``,
            ``step_async``: :class:`StepFns`).
        ctx: This rank.
        device: Where the model runs.
        seed: The run's seed (the micro-batch random streams derive from it).
        step: Optimizer steps completed before this one.
        count_fn: Scored targets of a micro-batch, for ``(sum, count)`` losses.
        check_counts: Check that the counts the loss returns are ``count_fn``'s (one host
            sync; the Trainer does it on its first step).
        telemetry: Where the step's compute, count collective and optimizer step are marked
            (a :class:`~gpu_training.telemetry.RankTelemetry`; by default nothing is).

    Returns:
        ``(grad_norm, losses)``: the strategy's :class:`~gpu_training.amp.GradNorm` (measured
        when clipping needs it or when read, before the next step; None if the strategy did
        not step) and one loss per micro-batch, scaled so that their mean
        over micro-batches and ranks is the global batch's loss.

    Raises:
        ValueError: With ``check_counts``, if the loss's counts differ from ``count_fn``'s.
    """
    accumulation = len(batches)
    first_index = ctx.rank * accumulation  # the sampler's layout is rank-major
    on_cpu = device.type == "cpu"
    total_count: Tensor | None = None
    losses: list[Tensor] = []
    norm: GradNorm | None = None
    telemetry.compute_started()
    for micro, batch in enumerate(batches):
        inputs, targets = batch if on_cpu else move_to_device(batch, device)
        with steps.sync(micro), micro_batch_rng(seed, step, first_index + micro, device):
            with steps.autocast():
                output = loss_fn(model(inputs), targets)
            if isinstance(output, tuple):
                if total_count is None:  # every rank reaches this at the same point
                    span = telemetry.collective_started()
                    total_count = global_count(batches, count_fn, ctx)
                    telemetry.collective_done(span)
                if check_counts:
                    _check_count(output[1], count_fn(batch[1]))
                loss = output[0] * global_scale(total_count, accumulation, ctx.world_size)
            else:
                loss = output
            kept = steps.backward(loss)  # the stepper's NaN guard detached it already
        losses.append(loss.detach() if kept is None else kept)
        if micro == accumulation - 1:
            telemetry.optimizer_started()
        norm = steps.step_async(micro)
    telemetry.step_done(step + 1)
    return norm, losses


def global_scale(scored: Tensor | float, accumulation: int, world_size: int) -> float:
    """The factor for a micro-batch's summed loss: ``sum / scored`` over the global batch.

    The stepper divides each micro-batch's loss by ``accumulation`` and DDP (or FSDP) averages
    the gradients over ``world_size`` ranks, so the sum is multiplied by
    ``accumulation * world_size / scored``.

    Args:
        scored: Scored targets of the whole global batch (:func:`global_count`).
        accumulation: Micro-batches per rank in the step.
        world_size: Ranks.

    Example:
        >>> global_scale(30, accumulation=2, world_size=3)  # 1/30 after the 1/2 and the 1/3
        0.2
    """
    return accumulation * world_size / max(float(scored), 1.0)


def global_count(
    batches: Sequence[Any], count_fn: Callable[[Tensor], Tensor], ctx: DistributedContext
) -> Tensor:
    """Scored targets in the whole global batch: this rank's, summed over the ranks.

    A collective when distributed: every rank calls it with its own micro-batches of the step.

    Args:
        batches: This rank's ``(inputs, targets)`` micro-batches of the step.
        count_fn: Scored targets of a micro-batch's targets.
        ctx: This rank.

    Returns:
        The count, as a 0-d float tensor.
    """
    local = sum(int(count_fn(batch[1])) for batch in batches)
    if not ctx.is_distributed:
        return torch.tensor(float(local))
    total = reduce_scalar_dict({"count": float(local)}, ctx, average=False)["count"]
    # A data-parallel view (tensor parallel) is smaller than the group: each replica's
    # ranks read the same samples, so each count arrives once per rank of the replica.
    replicas = dist.get_world_size() // ctx.world_size if process_group_up() else 1
    return torch.tensor(total / replicas)


def _check_count(returned: Tensor | int, counted: Tensor) -> None:
    if int(returned) != int(counted):
        raise ValueError(
            f"the loss returned a count of {int(returned)} scored targets where count_targets "
            f"finds {int(counted)}: a (sum, count) loss must count what the task's "
            "count_targets counts (targets != -100 by default), or the global normalization "
            "is wrong"
        )
