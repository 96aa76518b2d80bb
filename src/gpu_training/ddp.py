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
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from gpu_training.amp import MixedPrecisionStepper
from gpu_training.dist_init import (
    DEFAULT_TIMEOUT,
    DistributedContext,
    init_distributed,
    resolve_device,
)
from gpu_training.process_group import cleanup_distributed, collective_device, process_group_up

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


def make_distributed_sampler(
    dataset: Dataset[Any],
    ctx: DistributedContext,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> DistributedSampler[Any] | None:
    """A :class:`DistributedSampler` for this rank, or None in a single process.

    Returning None keeps the ``DataLoader(..., sampler=sampler, shuffle=(sampler is None))``
    idiom valid in both cases. Remember ``sampler.set_epoch(epoch)`` every epoch
    (:func:`train_one_epoch` does it).

    With ``drop_last=False`` and a dataset size not divisible by the world size, the sampler
    pads by repeating a few samples so that every rank gets the same count.
    """
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


def _set_epoch(loader: Iterable[Any], epoch: int) -> bool:
    batch_sampler = getattr(loader, "batch_sampler", None)
    # A DistributedSampler sits at loader.sampler; a GlobalBatchSampler is the batch_sampler.
    for candidate in (
        getattr(loader, "sampler", None),
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
    ):
        if candidate is not None and callable(getattr(candidate, "set_epoch", None)):
            candidate.set_epoch(epoch)
            return True
    return False


def train_one_epoch(
    model: nn.Module,
    loader: DataLoader[Any] | Iterable[Any],
    stepper: MixedPrecisionStepper,
    loss_fn: Callable[..., torch.Tensor],
    ctx: DistributedContext,
    *,
    epoch: int,
    device: torch.device | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    max_steps: int | None = None,
) -> dict[str, float]:
    """One pass over ``loader`` with accumulation, ``no_sync``, AMP and clipping done right.

    For each micro-batch ``(x, y)``: forward under ``stepper.autocast()``, ``stepper.backward``
    inside ``no_sync`` unless it closes an accumulation window, then ``stepper.step_async``
    (which acts only on boundaries) and ``scheduler.step()`` after each optimizer step. The
    host never waits for the device inside the epoch: losses and norms add up on the device
    and are read once at the end. Calls
    ``sampler.set_epoch(epoch)`` first. Trailing micro-batches that cannot fill a whole
    accumulation window are not trained on (their gradient would leak into the next epoch).

    Args:
        model: The (DDP-wrapped or plain) model.
        loader: Yields ``(inputs, targets)`` pairs.
        stepper: Holds the optimizer, precision and accumulation.
        loss_fn: ``loss_fn(model(inputs), targets)`` → scalar mean loss of the micro-batch.
        ctx: This process's context; metrics are averaged over its ranks.
        epoch: Epoch number, passed to ``sampler.set_epoch``.
        device: Where to move batches (default: the model's parameters' device).
        scheduler: LR scheduler stepped once per optimizer step.
        max_steps: Stop after this many optimizer steps.

    Returns:
        Averaged over ranks: ``loss`` (mean micro-batch loss), ``grad_norm`` (mean over the
        steps whose norm was measured: every step when the stepper clips, which measures them
        anyway, or when the loader has no ``len()`` and no ``max_steps`` bounds it; otherwise
        only the last step's), ``lr`` (at the end), and the counts ``steps``, ``skipped_steps`` and
        ``samples`` (per rank).
    """
    if not _set_epoch(loader, epoch) and ctx.is_distributed:
        warnings.warn(
            "train_one_epoch: the loader has no sampler with set_epoch(); without a "
            "DistributedSampler every rank trains on the same data",
            stacklevel=2,
        )
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    accum = stepper.grad_accum_steps
    usable: int | None = None
    if hasattr(loader, "__len__"):
        usable = (len(loader) // accum) * accum  # type: ignore[arg-type]
    model.train()
    # Running sums stay on the device: a .item() per micro-batch would sync the host.
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    norm_sum = torch.zeros((), dtype=torch.float64, device=device)
    norms = 0  # norms in norm_sum
    last_step = None if usable is None else usable // accum  # None: not known in advance
    if max_steps is not None:
        last_step = max_steps if last_step is None else min(last_step, max_steps)
    micro_batches = steps = skipped = samples = 0
    on_cpu = device.type == "cpu"
    losses: list[torch.Tensor] = []  # folded into loss_sum in chunks: one op per chunk
    for micro, batch in enumerate(loader):
        if usable is not None and micro >= usable:
            break
        inputs, targets = batch if on_cpu else move_to_device(batch, device)
        boundary = (micro + 1) % accum == 0
        # The boundary micro-batch syncs as usual: nothing to switch off, nothing to enter.
        with contextlib.nullcontext() if boundary else gradient_sync(model, enabled=False):
            with stepper.autocast():
                loss = loss_fn(model(inputs), targets)
            stepper.backward(loss)
        losses.append(loss.detach())
        if len(losses) == 256:
            loss_sum += torch.stack(losses).sum(dtype=torch.float64)
            losses.clear()
        samples += len(inputs)
        micro_batches += 1
        # Without clipping, a norm costs a pass over the gradients: measure the last one only.
        measure = last_step is None or steps + 1 == last_step
        norm = stepper.step_async(model.parameters(), micro, norm=measure)
        if norm is not None:
            steps += 1
            if stepper.last_step_skipped:
                skipped += 1
            elif norm.computed:
                norm_sum += norm.tensor().to(norm_sum)
                norms += 1
            if scheduler is not None:
                scheduler.step()
            if max_steps is not None and steps >= max_steps:
                break
    if losses:
        loss_sum += torch.stack(losses).sum(dtype=torch.float64)
    if micro_batches % accum:
        # An unfinished window (loader without len()): drop its gradient rather than leak it.
        stepper.optimizer.zero_grad(set_to_none=True)
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
