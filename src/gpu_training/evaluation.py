"""Validation over the same samples on any number of ranks: a sum and a count, not a mean of means.

``DistributedSampler`` pads the last round with repeated samples and each rank averages its
own batches, so a validation loss moves with the world size. Here each rank scores every
``world_size``-th sample of the evaluated prefix, no padding (:func:`eval_shard`); the ranks
add their loss sums and target counts (:func:`evaluate`), so the result is the loss over
every evaluated sample — or every scored target, for a ``(sum, count)`` loss — whatever the
split, to float rounding. A sharded forward is a collective, so every rank runs the same
number of forwards: a rank whose share is one batch short runs one unscored forward.

Example:
    >>> import contextlib, torch
    >>> from gpu_training.ddp import DistributedContext
    >>> data = [(torch.ones(2), torch.zeros(1)) for _ in range(5)]
    >>> shard = eval_shard(data, DistributedContext(), per_device_batch_size=2)
    >>> model = torch.nn.Linear(2, 1)
    >>> loss = torch.nn.functional.mse_loss
    >>> metrics = evaluate(model, shard, DistributedContext(), loss, torch.device("cpu"),
    ...                    contextlib.nullcontext)
    >>> sorted(metrics), shard.rounds
    (['loss', 'ppl'], 3)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gpu_training.ddp import DistributedContext, move_to_device, reduce_scalar_dict
from gpu_training.step import sum_and_count

__all__ = ["EvalShard", "eval_shard", "evaluate"]


@dataclass
class EvalShard:
    """This rank's share of the evaluated samples (:func:`eval_shard`)."""

    loader: DataLoader[Any]
    """Every ``world_size``-th sample of the evaluated prefix, from this rank's."""
    rounds: int
    """Forwards every rank runs: the largest share's batches."""


def eval_shard(
    dataset: Dataset[Any],
    ctx: DistributedContext,
    per_device_batch_size: int,
    limit: int | None = None,
) -> EvalShard:
    """This rank's share of the first ``limit`` samples (all of them when None), no padding.

    Args:
        dataset: The validation set.
        ctx: This rank's identity.
        per_device_batch_size: Samples per forward.
        limit: Samples evaluated in all (the same on every world size).

    Returns:
        The loader and the number of forwards every rank runs.
    """
    size = len(dataset)  # type: ignore[arg-type]
    if limit is not None:
        size = min(size, limit)
    shard = list(range(ctx.rank, size, ctx.world_size))
    rounds = math.ceil(math.ceil(size / ctx.world_size) / per_device_batch_size)
    return EvalShard(DataLoader(dataset, batch_size=per_device_batch_size, sampler=shard), rounds)


def evaluate(
    model: nn.Module,
    shard: EvalShard,
    ctx: DistributedContext,
    loss_fn: Callable[..., Any],
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
) -> dict[str, float]:
    """The loss over every evaluated sample (or scored target) of every rank; every rank.

    Args:
        model: The (wrapped) model; put back in training mode afterwards.
        shard: This rank's share (:func:`eval_shard`).
        ctx: This rank's identity.
        loss_fn: A mean loss, or a ``(sum, count)`` loss (scored targets).
        device: Where the model is.
        autocast: The precision context of the forward.

    Returns:
        ``{"loss": ..., "ppl": exp(loss)}``, the same on every rank.
    """
    loader = shard.loader
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    done = 0
    with torch.no_grad():
        for batch in loader:
            inputs, targets = move_to_device(batch, device)
            with autocast():
                part, n = sum_and_count(loss_fn(model(inputs), targets), targets)
            total += part.double()
            count += n.to(device=device, dtype=torch.float64)
            done += 1
        # A sharded forward is a collective (FSDP's all-gathers, DDP's buffer broadcast):
        # a rank whose share is one batch short runs one unscored forward, or they hang.
        for _ in range(shard.rounds - done):
            dummy = loader.collate_fn([loader.dataset[0]])
            with autocast():
                model(move_to_device(dummy, device)[0])
    model.train()
    sums = reduce_scalar_dict({"loss_sum": total, "count": count}, ctx, average=False)
    loss = sums["loss_sum"] / max(1.0, sums["count"])
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}
