"""Sharded (FSDP2) checkpoints through ``torch.distributed.checkpoint`` (DCP).

A sharded checkpoint has the same layout and guarantees as a plain one
(:mod:`~gpu_training.checkpoint.manager`): a directory ``DIR/step-00001234/`` that appears
whole or not at all, with ``manifest.json`` written last (``"state_format": "dcp"``, step,
world size, every file's size and checksum). It holds DCP's files — ``.metadata`` and one
``__<rank>_0.distcp`` per rank — plus ``extra.pt`` when ``extra`` state was given::

    step-00001234/
        .metadata           DCP's index of every tensor chunk (written by rank 0)
        __0_0.distcp        rank 0's shards of the model and optimizer state
        __1_0.distcp        rank 1's shards ...
        extra.pt            step, sampler, scheduler, scaler, RNG... (rank 0, torch.save)
        manifest.json       written last, by rank 0

This module holds what is FSDP/DCP-specific: gathering the state (``get_state_dict``: each
rank's own shards), ``dcp.save`` / ``dcp.load``, and putting the state back
(``set_state_dict``). How the directory is committed — one locked temporary directory, each
rank checksums and fsyncs what it wrote, rank 0 writes the manifest and renames, an error on
any rank reaches every rank as :class:`CheckpointError` and nothing is pruned — is shared with
DeepSpeed checkpoints and lives in :mod:`~gpu_training.checkpoint.collective`. The directory
must be on a file system every rank sees (one node, or NFS/Lustre...).

Loading reshards: a checkpoint saved by 8 ranks loads on 2, on 1 without a process group, or
into a plain (unsharded) model, because DCP stores each tensor's global shape and chunks.

``extra`` is stored apart from DCP, in ``extra.pt`` written by rank 0 and read back with
``torch.load(weights_only=True)``: DCP would keep an arbitrary rank's copy of non-tensor
values and unpickles them with ``weights_only=False``.

Trust: DCP's ``.metadata`` is a pickle. It is read with an unpickler that only builds DCP's
own metadata classes, every non-tensor value is checked with ``torch.load(weights_only=True)``
before DCP unpickles it, and DCP's own loads run forced to ``weights_only``
(:mod:`~gpu_training.checkpoint.dcp_read`, :mod:`~gpu_training.checkpoint.safe_load`): a
pickle payload in any file is refused and never runs. DCP's format was not designed for
hostile input in other ways (sizes, offsets), so for weights from a stranger a
``.safetensors`` file is still the better thing to ask for.

Example:
    >>> ckpt = CheckpointManager("checkpoints", ctx=ctx, keep_last_n=3)  # doctest: +SKIP
    >>> ckpt.save_sharded(model, optimizer, step, extra={"step": step})  # doctest: +SKIP
    >>> extra = ckpt.load_sharded(model, optimizer)  # every rank, any world size  # doctest: +SKIP

One plain file for inference: :func:`~gpu_training.checkpoint.offline.consolidate`
(``gpu-training ckpt consolidate``).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from gpu_training.checkpoint.attempt import Attempt, settle, uses_process_group
from gpu_training.checkpoint.collective import check_plain, choose_verified, save_directory
from gpu_training.checkpoint.dcp_mapped import MappedReader
from gpu_training.checkpoint.dcp_read import SafeLoadPlanner, check_dcp_storage, load_everything
from gpu_training.checkpoint.directory import CheckpointDirectory, PathOrStep
from gpu_training.checkpoint.files import (
    EXTRA_NAME,
    MANIFEST_NAME,
    SHARDED_FORMAT,
    CheckpointError,
)
from gpu_training.checkpoint.formats import SHARDED
from gpu_training.checkpoint.safe_load import load_plain, weights_only_loads
from gpu_training.ddp import DistributedContext

__all__ = ["EXTRA_NAME", "SHARDED_FORMAT", "load_everything", "load_sharded", "save_sharded"]

_NO_DIST_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST_WARNING)
        yield


# ----------------------------------------------------------------------------------------------
# saving


def _training_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    own = {id(p) for p in model.parameters()}
    if any(id(p) not in own for group in optimizer.param_groups for p in group["params"]):
        # fully_shard replaces the parameters: an optimizer built before it updates nothing
        raise CheckpointError(
            "the optimizer holds tensors that are not the model's parameters: create it "
            "after fully_shard(), from model.parameters()"
        )
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def _plain_leaves(obj: Any) -> Iterator[Any]:
    if isinstance(obj, torch.Tensor):
        return
    if isinstance(obj, Mapping):
        for value in obj.values():
            yield from _plain_leaves(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _plain_leaves(value)
    else:
        yield obj


def save_sharded(
    store: CheckpointDirectory,
    ctx: DistributedContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    *,
    extra: Mapping[str, Any] | None = None,
) -> Path | None:
    """Writes a sharded checkpoint of ``model`` (FSDP2 or plain) and ``optimizer``; every rank.

    The state comes from ``get_state_dict`` (each rank's own shards, keys without wrapper
    prefixes) and is written with ``dcp.save`` into one temporary directory, then committed by
    rank 0 as ``step-XXXXXXXX/`` with a manifest; older checkpoints beyond ``keep_last_n``
    are pruned. Call it on every rank. Usually called as ``CheckpointManager.save_sharded(...)``.

    Args:
        store: Where to save (the root, ``keep_last_n``, what manifests record).
        ctx: This rank's identity.
        model: The model, sharded with ``fully_shard`` or not.
        optimizer: Its optimizer, or None to save the model only.
        step: The step number (>= 0); an existing checkpoint of that step is replaced.
        extra: Other state to resume with (step, sampler, scheduler, scaler, RNG...): tensors,
            numbers, strings and lists/dicts of them. Rank 0's copy is saved.

    Returns:
        The checkpoint directory on rank 0, None on the other ranks.

    Raises:
        CheckpointError: On every rank if any rank failed (disk full, permissions, state that
            ``weights_only`` cannot load, a directory not shared by every rank...). The
            temporary directory is removed and no checkpoint is pruned.
        ValueError: If ``step`` is not an integer >= 0.
        TypeError: If ``extra`` is not a mapping.
    """
    state: dict[str, Any] = {}

    def gather() -> None:
        state.update(_training_state(model, optimizer))
        check_plain(list(_plain_leaves(state)), "the model and optimizer state")

    def write(tmp: Path) -> set[str]:
        # no fsync in DCP: save_directory fsyncs every file while it hashes it
        writer = FileSystemWriter(tmp, sync_files=False)
        with _quiet_single_process():
            metadata = dcp.save(state, storage_writer=writer)
        return {info.relative_path for info in (metadata.storage_data or {}).values()}

    return save_directory(store, ctx, step, write, SHARDED, extra=extra, prepare=gather)


# ----------------------------------------------------------------------------------------------
# loading


def load_sharded(
    store: CheckpointDirectory,
    ctx: DistributedContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    path_or_step: PathOrStep | None = None,
) -> dict[str, Any]:
    """Loads a sharded checkpoint into ``model`` and ``optimizer`` in place; every rank.

    Works on any world size and sharding: a checkpoint saved by N ranks loads on M ranks
    (FSDP2 or not) and in a single process without a process group, into a plain model. Each
    rank checksums a share of the files first; with no ``path_or_step`` it takes the newest
    sharded checkpoint that verifies, warning about newer ones that do not. Usually called as
    ``CheckpointManager.load_sharded(...)``. Build the optimizer before loading (its state is filled in).

    DCP's ``.metadata`` pickle is read with an allowlisting unpickler, non-tensor values are
    checked with ``weights_only=True`` first and DCP's own loads are forced to
    ``weights_only`` (see the module docstring): nothing in the directory runs.

    Args:
        store: The checkpoint root.
        ctx: This rank's identity.
        model: The model to fill, sharded with ``fully_shard`` or not.
        optimizer: Its optimizer, or None to load the model weights only.
        path_or_step: A checkpoint directory, a step number, or None for the newest.

    Returns:
        The ``extra`` state saved with the checkpoint (an empty dict if there was none).

    Raises:
        CheckpointError: On every rank, if there is no checkpoint, it fails verification, is a
            plain checkpoint, does not match the model or optimizer, or any rank failed.
    """
    uses_process_group(ctx)
    chosen = choose_verified(store, ctx, path_or_step, SHARDED)
    what = f"could not load {chosen}"

    state: dict[str, Any] = {}
    with Attempt() as prepare:
        # the index must read only files the manifest vouches for, and hold plain values only
        manifest = json.loads((chosen / MANIFEST_NAME).read_text())
        check_dcp_storage(chosen, [str(e["name"]) for e in manifest["files"]])
        state = _training_state(model, optimizer)
    settle(ctx, prepare, what)  # before dcp.load: its collectives need every rank

    extra: dict[str, Any] = {}
    with Attempt() as load:
        with _quiet_single_process(), weights_only_loads():
            # the files were just read and hashed: mapped, their pages are copied once
            dcp.load(state, storage_reader=MappedReader(chosen), planner=SafeLoadPlanner())
        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            set_state_dict(
                model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
        if (chosen / EXTRA_NAME).exists():
            extra = load_plain(chosen / EXTRA_NAME)
    settle(ctx, load, what)
    return extra
