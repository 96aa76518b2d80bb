"""DeepSpeed ZeRO checkpoints resumed anywhere, and any checkpoint resumed under ZeRO.

Two every-rank loads, both through per-parameter full state
(:mod:`~gpu_training.checkpoint.full_state`):

- :func:`load_into_deepspeed` — any checkpoint into a ZeRO engine. A DeepSpeed checkpoint laid
  out as the engine is (stage, world size, offload) goes through DeepSpeed's own load, bitwise
  as before (:func:`~gpu_training.checkpoint.zero.load_deepspeed`); any other — another world
  size or stage, a plain ``state.pt``, DCP shards — is read parameter by parameter from its
  format's :meth:`~gpu_training.checkpoint.CheckpointFormat.param_source` and written into the
  engine's own partitions (:func:`~gpu_training.checkpoint.zero_sink.load_into_engine`), and
  an fp16 loss scale into its loss scaler (:mod:`~gpu_training.checkpoint.loss_scale`);
- :func:`load_resharded` — a checkpoint read through its format's ``param_source`` into a plain,
  DDP or FSDP2 model and its torch optimizer
  (:func:`~gpu_training.checkpoint.full_state.load_into_module`): how a ZeRO checkpoint resumes
  under none, DDP and FSDP2.

Every rank reads what it needs from the shared files itself (memory-mapped where the format
allows): no rank holds more than its own layout's share plus a batch of whole parameters.
Nothing is written. Each phase ends in :func:`~gpu_training.checkpoint.attempt.settle`, so an
error on any rank reaches every rank before the next collective.

Example:
    >>> run_state, extra = ckpt.load_into_deepspeed(engine, 10)  # every rank  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_training.checkpoint.attempt import Attempt, settle, uses_process_group
from gpu_training.checkpoint.collective import choose_verified
from gpu_training.checkpoint.directory import CheckpointDirectory, PathOrStep
from gpu_training.checkpoint.formats import DEEPSPEED, format_of
from gpu_training.checkpoint.full_state import ModuleSink, ParamSource, Sink
from gpu_training.checkpoint.loss_scale import carry_into_engine, loss_scale_of
from gpu_training.checkpoint.zero import load_deepspeed
from gpu_training.checkpoint.zero_sink import EngineSink
from gpu_training.checkpoint.zero_source import ZeroLayout, zero_layout
from gpu_training.ddp import DistributedContext

__all__ = ["engine_layout", "load_into_deepspeed", "load_resharded"]

Loaded = tuple[dict[str, Any], dict[str, Any]]
"""The run state saved and the caller's extra, as a format's load returns them."""


def engine_layout(engine: Any) -> ZeroLayout:
    """A DeepSpeed engine's :class:`~gpu_training.checkpoint.zero_source.ZeroLayout`."""

    def device(section: Any) -> str:
        value = getattr(section, "device", None) if section is not None else None
        return str(getattr(value, "value", value) or "none")

    return ZeroLayout(
        stage=int(engine.zero_optimization_stage()),
        world_size=int(engine.dp_world_size),
        offload_optimizer=device(engine.zero_offload_optimizer()),
        offload_param=device(engine.zero_offload_param()),
    )


def load_into_deepspeed(
    store: CheckpointDirectory,
    ctx: DistributedContext,
    engine: Any,
    path_or_step: PathOrStep,
    *,
    trusted: bool = False,
) -> Loaded:
    """Loads a checkpoint of any format and layout into a freshly built ZeRO engine; every rank.

    Usually called as ``CheckpointManager.load_into_deepspeed(engine, path)``.

    Args:
        store: The checkpoint root.
        ctx: This rank's identity.
        engine: The ``DeepSpeedEngine`` to fill (ZeRO stage 1-3).
        path_or_step: A checkpoint directory or step number.
        trusted: Unpickle DeepSpeed's files without the allow-list.

    Returns:
        The run state saved, and the caller's extra.

    Raises:
        CheckpointError: On every rank, if the checkpoint is missing, damaged, refused by the
            allow-lists, of another model, or any rank failed.
    """
    path = store.resolve(path_or_step)
    saved = format_of(store.manifest(path))
    same = False
    with Attempt() as look:
        if saved is DEEPSPEED:  # DeepSpeed's own load, where it can: bitwise, as before
            same = zero_layout(path, trusted=trusted) == engine_layout(engine)
    if all(settle(ctx, look, f"could not load {path}", same)):
        extra = load_deepspeed(store, ctx, engine, path, trusted=trusted)
        return extra, extra

    loaded = _resharded(store, ctx, path, EngineSink(engine), trusted=trusted)
    engine.global_steps = int(loaded[0].get("step", 0))  # what DeepSpeed's own load restores
    engine.global_samples = engine.global_steps * int(engine.train_batch_size())
    carry_into_engine(engine, loss_scale_of(loaded[0]))  # fp16: a GradScaler's or DeepSpeed's
    return loaded


def load_resharded(
    store: CheckpointDirectory,
    ctx: DistributedContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    path_or_step: PathOrStep,
    *,
    trusted: bool = False,
) -> Loaded:
    """Loads a checkpoint, read per parameter, into a plain, DDP or FSDP2 run; every rank.

    How a DeepSpeed ZeRO checkpoint resumes under none, DDP and FSDP2, at any world size.
    Usually called as ``CheckpointManager.load_resharded(model, optimizer, path)``.

    Args:
        store: The checkpoint root.
        ctx: This rank's identity.
        model: The model to fill, sharded with ``fully_shard`` or not.
        optimizer: Its optimizer, built from its parameters.
        path_or_step: A checkpoint directory or step number.
        trusted: Unpickle DeepSpeed's files without the allow-list.

    Returns:
        The run state saved, and the caller's extra.

    Raises:
        CheckpointError: On every rank, if the checkpoint is missing, damaged, refused by the
            allow-lists, of another model, or any rank failed.
    """
    path = store.resolve(path_or_step)
    return _resharded(store, ctx, path, ModuleSink(model, optimizer), trusted=trusted)


def _resharded(
    store: CheckpointDirectory, ctx: DistributedContext, path: Path, sink: Sink, *, trusted: bool
) -> Loaded:
    """Verify, open the checkpoint's per-parameter source, fill the run: each phase settled."""
    uses_process_group(ctx)
    saved = format_of(store.manifest(path))
    chosen = choose_verified(store, ctx, path, saved)  # each rank checksums a share
    what = f"could not load {chosen}"
    source: ParamSource | None = None
    loaded: Loaded = ({}, {})
    with Attempt() as prepare:
        manifest = store.manifest(chosen)
        source = saved.param_source(chosen, manifest, order=sink.order, trusted=trusted)
        sink.check(source)
        loaded = source.run_state()
    settle(ctx, prepare, what)  # before any collective of the sink's
    assert source is not None
    sink.begin()
    with Attempt() as load:
        sink.fill(source)
    settle(ctx, load, what)  # a failed fill is known everywhere before the last collective
    sink.end()
    return loaded
