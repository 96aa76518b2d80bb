"""DistributedDataParallel done right: rank identity, process group, sharding, metrics, teardown.

The same script runs unchanged in a notebook (one process) and under ``torchrun``::

    from gpu_training.ddp import init_distributed, resolve_device, cleanup_distributed

    ctx = init_distributed()          # nccl with GPUs, gloo otherwise; no-op in one process
    device = resolve_device(ctx)      # cuda:<local_rank>, or cpu
    try:
        ...
    finally:
        cleanup_distributed()         # idempotent; no barrier when an exception is in flight

Every helper here that talks to other ranks is called by every rank; only
``ctx.is_main_process`` prints or writes.

This module holds the training-side helpers (the sampler, metric reduction, wrappers, the
epoch loop) and re-exports the rest: :mod:`gpu_training.dist_init` (:class:`DistributedContext`,
:func:`init_distributed`, :func:`resolve_device`) and :mod:`gpu_training.process_group`
(:func:`process_group_up`, :func:`cleanup_distributed`, :func:`collective_device`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, overload

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from gpu_training.amp import MixedPrecisionStepper, nonfinite_warning
from gpu_training.data import GlobalBatchSampler
from gpu_training.dist_init import (
    DEFAULT_TIMEOUT,
    DistributedContext,
    init_distributed,
    resolve_device,
)
from gpu_training.process_group import cleanup_distributed, collective_device, process_group_up
from gpu_training.streaming import StreamPosition

if TYPE_CHECKING:
    from gpu_training.step import LossOutput

__all__ = [
    "DEFAULT_TIMEOUT",
    "DistributedContext",
    "cleanup_distributed",
    "gradient_sync",
    "init_distributed",
    "make_distributed_sampler",
    "move_to_device",
    "process_group_up",
    "reduce_scalar_dict",
    "resolve_device",
    "train_one_epoch",
    "unwrap_model",
]


@overload
def make_distributed_sampler(
    dataset: Dataset[Any],
    ctx: DistributedContext,
    shuffle: bool = ...,
    seed: int = ...,
    drop_last: bool = ...,
    *,
    global_batch_size: None = None,
    per_device_batch_size: None = None,
) -> DistributedSampler[Any] | None: ...


@overload
def make_distributed_sampler(
    dataset: Dataset[Any],
    ctx: DistributedContext,
    shuffle: bool = ...,
    seed: int = ...,
    drop_last: bool = ...,
    *,
    global_batch_size: int,
    per_device_batch_size: int,
) -> GlobalBatchSampler: ...


def make_distributed_sampler(
    dataset: Dataset[Any],
    ctx: DistributedContext,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    *,
    global_batch_size: int | None = None,
    per_device_batch_size: int | None = None,
) -> DistributedSampler[Any] | GlobalBatchSampler | None:
    """This rank's share of the data: a global-batch sampler, or a ``DistributedSampler``.

    With ``global_batch_size`` and ``per_device_batch_size`` (the way to keep promise 1): a
    :class:`~gpu_training.data.GlobalBatchSampler`, also in one process. Use it as the
    loader's ``batch_sampler`` and give the stepper its accumulation::

        sampler = make_distributed_sampler(dataset, ctx, seed=0, global_batch_size=256,
                                           per_device_batch_size=32)
        loader = DataLoader(dataset, batch_sampler=sampler)
        stepper = MixedPrecisionStepper(optimizer,
                                        grad_accum_steps=sampler.gradient_accumulation_steps)

    Every optimizer step then trains on the same samples, grouped in the same micro-batches,
    on any number of ranks, and a checkpoint of ``sampler.state_dict()`` resumes mid-epoch on
    any of them. The incomplete last global batch of an epoch is always dropped
    (``drop_last`` does not apply).

    Without them: a :class:`~torch.utils.data.DistributedSampler` for this rank, or None in a
    single process, which keeps the ``DataLoader(..., sampler=sampler,
    shuffle=(sampler is None))`` idiom valid in both cases. Remember
    ``sampler.set_epoch(epoch)`` every epoch (:func:`train_one_epoch` does it). With
    ``drop_last=False`` and a dataset size not divisible by the world size, it pads by
    repeating a few samples so that every rank gets the same count. What each sampler keeps
    of promise 1 is in docs/foundation.md ("Which sampler keeps which promise").

    Args:
        dataset: The dataset to shard (it needs a ``len()``).
        ctx: This process's context.
        shuffle: A new seeded permutation every epoch.
        seed: The permutations' seed; the same on every rank.
        drop_last: ``DistributedSampler`` only: drop the tail instead of padding it.
        global_batch_size: Samples per optimizer step over all ranks.
        per_device_batch_size: Samples per micro-batch on one rank.

    Raises:
        ValueError: If only one of ``global_batch_size`` and ``per_device_batch_size`` is given.
        SamplerConfigError: If the global batch does not split into ``world_size`` ranks of
            whole micro-batches, or is larger than the dataset (the message says what fits).
    """
    if (global_batch_size is None) != (per_device_batch_size is None):
        given = "global_batch_size" if per_device_batch_size is None else "per_device_batch_size"
        raise ValueError(
            f"make_distributed_sampler: {given} needs its pair: give both global_batch_size "
            "and per_device_batch_size (a global-batch sampler), or neither"
        )
    if global_batch_size is not None and per_device_batch_size is not None:
        return GlobalBatchSampler(
            len(dataset),  # type: ignore[arg-type]
            global_batch_size,
            per_device_batch_size,
            ctx,
            seed=seed,
            shuffle=shuffle,
        )
    if not ctx.is_distributed:
        return None
    return DistributedSampler(
        dataset,
        num_replicas=ctx.world_size,
        rank=ctx.rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )


def reduce_scalar_dict(
    values: Mapping[str, float | int | torch.Tensor],
    ctx: DistributedContext,
    average: bool = True,
) -> dict[str, float]:
    """All-reduce a dict of scalars in one collective; every rank gets the result.

    Each rank computes loss on its own shard, so rank 0's number is not the global one.

    Args:
        values: Name → Python number or 0-d/1-element tensor. Every rank must pass the same
            keys (they are sorted, so insertion order does not matter).
        ctx: This process's context.
        average: Divide the sum by the world size.

    Returns:
        Name → reduced float, identical on every rank.

    Raises:
        ValueError: If a value is a tensor with more than one element.
    """
    keys = sorted(values)
    flat: list[float | torch.Tensor] = []
    for key in keys:
        value = values[key]
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"value {key!r} must be a scalar, got shape {tuple(value.shape)}")
            value = value.detach().reshape(())
        flat.append(value)
    if not (ctx.is_distributed and process_group_up()):
        return {k: float(v) for k, v in zip(keys, flat, strict=True)}
    device = collective_device()
    packed = (
        torch.stack(
            [torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in flat]
        )
        if flat
        else torch.zeros(0, dtype=torch.float64, device=device)
    )
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    if average:
        packed /= ctx.world_size
    return dict(zip(keys, packed.tolist(), strict=True))


def _wrapper_inner(model: nn.Module) -> nn.Module | None:
    """The module a known wrapper holds, or None when ``model`` is not a wrapper."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    if isinstance(model, (DistributedDataParallel, DataParallel)):
        return model.module
    orig = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
    if isinstance(orig, nn.Module):
        return orig
    with contextlib.suppress(ImportError):
        from torch.distributed.fsdp import FullyShardedDataParallel

        if isinstance(model, FullyShardedDataParallel):
            return model.module
    inner = getattr(model, "module", None)  # DeepSpeedEngine and Lightning-style wrappers
    if isinstance(inner, nn.Module) and type(model).__name__ in {
        "DeepSpeedEngine",
        "_FabricModule",
        "_LightningModuleWrapperBase",
    }:
        return inner
    return None


def unwrap_model(model: nn.Module) -> nn.Module:
    """Strip DDP, DataParallel, FSDP1, DeepSpeed and ``torch.compile`` wrappers (nested too).

    Save ``unwrap_model(model).state_dict()``: its keys carry no ``module.`` /
    ``_orig_mod.`` prefixes and load into a plain model for inference. (FSDP2's
    ``fully_shard`` changes the module in place and needs no unwrapping.)
    """
    seen = 0
    while (inner := _wrapper_inner(model)) is not None:
        model = inner
        seen += 1
        if seen > 16:  # a wrapper that points at itself would loop forever
            raise RuntimeError("unwrap_model: wrapper chain deeper than 16")
    return model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce inside the block when ``enabled`` is False.

    DDP all-reduces on every ``backward()``; during accumulation that syncs gradients you
    are about to keep summing. This uses ``model.no_sync()`` (DDP) or FSDP2's
    ``set_requires_gradient_sync`` and does nothing for a plain module.
    """
    if enabled:
        yield
        return
    no_sync = getattr(model, "no_sync", None)
    if callable(no_sync):
        with no_sync():
            yield
        return
    setter = getattr(model, "set_requires_gradient_sync", None)
    if callable(setter):
        setter(False)
        try:
            yield
        finally:
            setter(True)
        return
    yield


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Move tensors in a (nested) tuple/list/dict batch to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, Mapping):
        return {k: move_to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device) for v in batch)
    return batch


def _epoch_sampler(loader: Iterable[Any]) -> Any:
    """The loader's sampler that has ``set_epoch`` (a ``DistributedSampler`` at
    ``loader.sampler``, a ``GlobalBatchSampler`` as its ``batch_sampler``), or None."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    for candidate in (
        getattr(loader, "sampler", None),
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
    ):
        if candidate is not None and callable(getattr(candidate, "set_epoch", None)):
            return candidate
    return None


def _first_step(loader: Iterable[Any], sampler: Any, epoch: int, accum: int) -> int:
    """Optimizer steps the run took before this epoch's next one: the random streams' key.

    A global-batch sampler knows it exactly, a resumed position included; a sized loader
    counts whole epochs; an unsized one keeps epochs apart in the high 32 bits.
    """
    if isinstance(sampler, GlobalBatchSampler):
        # len() is what the next iteration yields (from the resumed position): read it before
        # iter(), as DataLoader workers prefetch and move the position.
        done_in_epoch = sampler.steps_per_epoch - len(sampler) // accum
        return epoch * sampler.steps_per_epoch + done_in_epoch
    if hasattr(loader, "__len__"):
        return epoch * (len(loader) // accum)  # type: ignore[arg-type]
    if isinstance(sampler, StreamPosition):  # a stream's cursor: the steps done in its epoch
        return (epoch << 32) + sampler.position
    return epoch << 32


def train_one_epoch(
    model: nn.Module,
    loader: DataLoader[Any] | Iterable[Any],
    stepper: MixedPrecisionStepper,
    loss_fn: Callable[[Any, Any], LossOutput],
    ctx: DistributedContext,
    *,
    epoch: int,
    device: torch.device | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    max_steps: int | None = None,
    seed: int | None = None,
    first_step: int | None = None,
    count_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:
    """One pass over ``loader``, with the same optimizer step as the Trainer's.

    The loader's micro-batches are taken ``stepper.grad_accum_steps`` at a time, one
    optimizer step each, through :func:`gpu_training.step.train_step`, the Trainer's own step:
    forward under ``stepper.autocast()``, backward inside ``no_sync`` off the accumulation
    boundary, each micro-batch drawing its random numbers (dropout) from its own stream keyed
    by (``seed``, the step, its place in the global batch), and a loss that returns
    ``(sum, count)`` divided by the scored targets of the whole global batch. A loss that
    returns a mean is used as is. Then ``scheduler.step()`` after each optimizer step. Calls
    ``sampler.set_epoch(epoch)`` first. Micro-batches that cannot fill a whole accumulation
    window at the end are not trained on. The host never waits for the device inside the
    epoch: losses and norms add up on the device and are read once at the end.

    With a global-batch sampler (:func:`make_distributed_sampler` with
    ``global_batch_size``) the weights after each step do not depend on the number of ranks,
    dropout and masked targets included; docs/foundation.md says what holds with a
    ``DistributedSampler``.

    Args:
        model: The (DDP-wrapped, FSDP2 or plain) model.
        loader: Yields ``(inputs, targets)`` pairs.
        stepper: Holds the optimizer, precision and accumulation.
        loss_fn: ``loss_fn(model(inputs), targets)`` → the micro-batch's mean loss, or
            ``(sum over scored targets, their count)`` (e.g.
            :func:`gpu_training.tasks.cross_entropy_sum`, targets of -100 not scored).
        ctx: This process's context; metrics are averaged over its ranks.
        epoch: Epoch number, passed to ``sampler.set_epoch``.
        device: Where to move batches (default: the model's parameters' device).
        scheduler: LR scheduler stepped once per optimizer step.
        max_steps: Stop after this many optimizer steps.
        seed: The random streams' seed (default: the sampler's seed, else 0).
        first_step: Optimizer steps the run took before this call (the streams' key; default:
            from a global-batch sampler's epoch and position, else ``epoch`` × steps per
            epoch of a sized loader).
        count_fn: Scored targets of a micro-batch, for ``(sum, count)`` losses (default:
            targets that are not -100). The counts the loss returns are checked against it
            on the first step.

    Returns:
        Averaged over ranks: ``loss`` (the mean of the steps' global-batch losses),
        ``grad_norm`` (mean over the steps whose norm was measured: every step when the
        stepper clips, which measures them anyway, or when the loader has no ``len()`` and
        no ``max_steps`` bounds it; otherwise only the last step's), ``lr`` (at the end), and
        the counts ``steps``, ``skipped_steps`` and ``samples`` (per rank).

    Raises:
        ValueError: If a global-batch sampler's accumulation is not the stepper's, or a
            ``(sum, count)`` loss counts other targets than ``count_fn``.
    """
    from gpu_training.step import step_batches, step_fns, train_step  # step imports this module
    from gpu_training.tasks import count_scored

    sampler = _epoch_sampler(loader)
    if sampler is not None:
        sampler.set_epoch(epoch)
    elif ctx.is_distributed:
        warnings.warn(
            "train_one_epoch: the loader has no sampler with set_epoch(); without a "
            "DistributedSampler every rank trains on the same data",
            stacklevel=2,
        )
    accum = stepper.grad_accum_steps
    if isinstance(sampler, GlobalBatchSampler) and sampler.gradient_accumulation_steps != accum:
        raise ValueError(
            f"train_one_epoch: the sampler gives {sampler.gradient_accumulation_steps} "
            f"micro-batches per global batch on each rank, the stepper accumulates {accum}: "
            "create the stepper with grad_accum_steps=sampler.gradient_accumulation_steps"
        )
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if seed is None:
        seed = int(getattr(sampler, "seed", 0))
    if first_step is None:
        first_step = _first_step(loader, sampler, epoch, accum)
    last_step = None if not hasattr(loader, "__len__") else len(loader) // accum  # type: ignore[arg-type]
    if max_steps is not None:
        last_step = max_steps if last_step is None else min(last_step, max_steps)
    steps_fns = step_fns(model, stepper)
    model.train()
    # Running sums stay on the device: a .item() per micro-batch would sync the host.
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    norm_sum = torch.zeros((), dtype=torch.float64, device=device)
    norms = micro_batches = steps = skipped = samples = 0
    losses: list[torch.Tensor] = []  # folded into loss_sum in chunks: one op per chunk
    for batches in step_batches(loader, accum):
        norm, step_losses = train_step(
            batches,
            model,
            loss_fn,
            steps_fns,
            ctx=ctx,
            device=device,
            seed=seed,
            step=first_step + steps,
            count_fn=count_fn or count_scored,
            check_counts=steps == 0,
        )
        # settle: a fused CUDA optimizer's NaN flag is read now, not a step later (exact
        # sums here; the Trainer reads it late to keep the host ahead of the GPU)
        warning = nonfinite_warning(
            stepper, first_step + steps + 1, settle=True
        )  # raises at the limit
        if warning is not None:  # skipped on every rank: keep its NaN out of the mean
            if ctx.is_main_process:
                print(warning, flush=True)
        else:
            losses.extend(step_losses)
            micro_batches += len(batches)
        if len(losses) >= 256:
            loss_sum += torch.stack(losses).sum(dtype=torch.float64)
            losses.clear()
        samples += sum(len(batch[1]) for batch in batches)
        steps += 1
        if stepper.last_step_skipped:
            skipped += 1
        elif norm is not None and (norm.computed or last_step is None or steps == last_step):
            # Without clipping a norm costs a pass over the gradients: read the last one only.
            norm_sum += norm.tensor().to(norm_sum)
            norms += 1
        if scheduler is not None:
            scheduler.step()
        if max_steps is not None and steps >= max_steps:
            break
    if losses:
        loss_sum += torch.stack(losses).sum(dtype=torch.float64)
    metrics = reduce_scalar_dict(
        {
            "loss": loss_sum / max(1, micro_batches),
            "grad_norm": norm_sum / max(1, norms),
            "steps": steps,
            "skipped_steps": skipped,
            "samples": samples,
        },
        ctx,
        average=True,
    )
    metrics["lr"] = float(stepper.optimizer.param_groups[0]["lr"])
    return metrics
