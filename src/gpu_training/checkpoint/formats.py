"""Checkpoint formats as objects: one interface, one implementation per format, one registry.

A checkpoint's model and optimizer are written one of three ways — one ``state.pt`` from
rank 0 (plain), DCP shards (sharded: FSDP2), or DeepSpeed's own files — and its manifest says
which (``"state_format"``: none for plain, ``"dcp"``, ``"deepspeed"``). Whatever depends on
the format asks a :class:`CheckpointFormat` rather than comparing names:

- in a run, every rank: :meth:`~CheckpointFormat.save` and :meth:`~CheckpointFormat.load`
  through a :class:`~gpu_training.checkpoint.CheckpointManager`, and whether a format can
  load what another wrote (:meth:`~CheckpointFormat.can_load`: every format reads every
  other's checkpoints, at any world size), and :meth:`~CheckpointFormat.param_source` (its
  checkpoint per parameter, whole: what resharding into another layout reads);
- offline, one process and no process group: :meth:`~CheckpointFormat.check_contents` (the
  allow-lists, before a resume), :meth:`~CheckpointFormat.saved_shapes`,
  :meth:`~CheckpointFormat.full_state` (the whole, unsharded model and optimizer: what
  consolidation, export and resharding read) and :meth:`~CheckpointFormat.read_extra`;
- and how messages name it (:attr:`~CheckpointFormat.title`...).

:func:`checkpoint_format` resolves every name a format goes by (``dcp``, ``sharded``,
``fsdp``...) in one place; :func:`format_of` reads a manifest. The module sits below every
module that uses it (``offline``, ``collective``, ``sharded``, ``zero``; the manager is handed
in as :class:`Checkpoints`, never imported) and imports DCP's and DeepSpeed's readers only
when such a checkpoint is read.

Example:
    >>> checkpoint_format("fsdp") is checkpoint_format("dcp") is SHARDED
    True
    >>> format_of({"state_format": "deepspeed"}).title, format_of({}).title
    ('DeepSpeed', 'plain')
    >>> SHARDED.can_load(PLAIN), PLAIN.can_load(DEEPSPEED), DEEPSPEED.can_load(SHARDED)
    (True, True, True)
    >>> checkpoint_format("pickle")
    Traceback (most recent call last):
    ...
    gpu_training.checkpoint.files.CheckpointError: unknown checkpoint format 'pickle': ...
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import torch
from torch import nn

from gpu_training.checkpoint.files import (
    DEEPSPEED_FORMAT,
    EXTRA_NAME,
    SHARDED_FORMAT,
    STATE_NAME,
    CheckpointError,
)
from gpu_training.checkpoint.full_state import DcpSource, ParamSource, PlainSource
from gpu_training.checkpoint.keys import strip_wrapper_prefixes
from gpu_training.checkpoint.safe_load import DEEPSPEED_SAFE_GLOBALS, check_pickles, load_plain
from gpu_training.checkpoint.seams import Checkpointable, Checkpoints, Order, PathOrStep
from gpu_training.ddp import unwrap_model

__all__ = [
    "DEEPSPEED",
    "NAMES",
    "PLAIN",
    "SHARDED",
    "CheckpointFormat",
    "Checkpointable",
    "Checkpoints",
    "DeepSpeedCheckpointFormat",
    "PlainCheckpointFormat",
    "ShardedCheckpointFormat",
    "checkpoint_format",
    "format_of",
    "load_model_and_optimizer",
    "plain_training_state",
    "state_format",
]

Shapes = dict[str, tuple[int, ...]]
"""Parameter name -> shape."""


class CheckpointFormat(Protocol):
    """One way of writing a checkpoint's model and optimizer (see the module docstring)."""

    name: str
    """The manifest's ``state_format`` (``"torch"`` for plain, whose manifests name none)."""
    title: str
    """What messages call it: ``plain``, ``sharded (FSDP/DCP)``, ``DeepSpeed``."""
    label: str
    """What ``gpu-training ckpt inspect`` shows in its format row."""
    loader: str
    """The :class:`~gpu_training.checkpoint.CheckpointManager` method that loads it."""
    lists_every_file: bool
    """Its reader finds files by name pattern: a file the manifest does not list is a problem."""
    shards: bool
    """Each rank holds a part of the model and optimizer state, not all of it."""

    def can_load(self, saved: CheckpointFormat) -> bool:
        """Whether :meth:`load` reads a checkpoint written in ``saved`` (resharding it)."""
        ...

    def save(
        self,
        ckpt: Checkpoints,
        run: Checkpointable,
        run_state: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
    ) -> Path | None:
        """Saves ``run``'s model and optimizer, the run state and ``extra``; every rank.

        The run state's ``step`` is the checkpoint's. Rank 0 gets the directory, the others
        None.
        """
        ...

    def load(
        self, ckpt: Checkpoints, run: Checkpointable, path: PathOrStep
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Loads ``run``'s model and optimizer in place; every rank.

        The checkpoint may be of any format :meth:`can_load` accepts. Returns the run state
        saved and the caller's extra.
        """
        ...

    def check_contents(
        self, step_dir: Path, manifest: Mapping[str, Any], *, trusted: bool = False
    ) -> None:
        """Refuses a file a load would read that holds more than plain data; nothing runs.

        ``trusted`` skips what ``--trust-checkpoint`` lets a third-party reader unpickle.
        """
        ...

    def saved_shapes(self, step_dir: Path, manifest: Mapping[str, Any]) -> Shapes | None:
        """Parameter name -> shape of the model saved; None where that is not cheap to know."""
        ...

    def full_state(
        self, step_dir: Path, manifest: Mapping[str, Any], *, trusted: bool = False
    ) -> dict[str, Any]:
        """``{"model_state", "optimizer_state"?, "extra"?}``, whole, read in this process.

        No process group; the model's keys carry no wrapper prefixes.
        """
        ...

    def read_extra(self, step_dir: Path) -> dict[str, Any]:
        """The caller's extra state saved, as :meth:`load` returns it second."""
        ...

    def read_run_state(self, step_dir: Path) -> dict[str, Any]:
        """The run state saved (``world_size``, ``sampler_state``...), without the model's."""
        ...

    def param_source(
        self, step_dir: Path, manifest: Mapping[str, Any], *, order: Order, trusted: bool = False
    ) -> ParamSource:
        """Its checkpoint read per parameter, whole, for another layout to load (resharding).

        ``order`` names the loading run's parameters in its optimizer's order (what a plain
        optimizer state's indices mean). No collective; see
        :mod:`~gpu_training.checkpoint.full_state`.
        """
        ...


# ----------------------------------------------------------------------------------------------
# the plain format's one dict


def plain_training_state(
    run_state: Mapping[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The plain format's one dict: the run state, the model and optimizer, the caller's extra.

    Args:
        run_state: What :func:`~gpu_training.resume.capture_run_state` returned.
        model: The (possibly wrapped) model; its unwrapped ``state_dict`` is saved.
        optimizer: Its ``state_dict`` is saved.
        extra: Plain data of the caller's, kept under ``"extra"``.

    Returns:
        What :func:`~gpu_training.resume.capture_training_state` returns, and
        :func:`~gpu_training.resume.restore_training_state` reads.
    """
    run = dict(run_state)
    return {
        "step": run.pop("step"),
        "world_size": run.pop("world_size"),
        "model_state": unwrap_model(model).state_dict(),
        "optimizer_state": optimizer.state_dict(),
        **run,
        "extra": dict(extra or {}),
    }


def load_model_and_optimizer(
    state: Mapping[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Puts a plain state's ``model_state`` and ``optimizer_state`` back, in place."""
    unwrap_model(model).load_state_dict(state["model_state"])
    optimizer.load_state_dict(state["optimizer_state"])


# ----------------------------------------------------------------------------------------------
# the three formats


def _pickles(step_dir: Path, manifest: Mapping[str, Any]) -> list[Path]:
    """The ``.pt`` files the manifest lists."""
    files = [step_dir / str(e["name"]) for e in manifest["files"]]
    return [f for f in files if f.suffix == ".pt"]


def _listed(manifest: Mapping[str, Any]) -> list[str]:
    return [str(e["name"]) for e in manifest["files"]]


def _extra_file(step_dir: Path) -> dict[str, Any]:
    """``extra.pt`` (DCP and DeepSpeed: the run state and the caller's extra), or nothing."""
    return load_plain(step_dir / EXTRA_NAME) if (step_dir / EXTRA_NAME).exists() else {}


def _checked(out: dict[str, Any], step_dir: Path) -> dict[str, Any]:
    if not isinstance(out.get("model_state"), Mapping):
        raise CheckpointError(f"{step_dir} holds no model state ('model_state')")
    out["model_state"] = strip_wrapper_prefixes(out["model_state"])
    return out


class PlainCheckpointFormat:
    """One ``state.pt`` from rank 0: the model, the optimizer and the run state in one dict.

    Args:
        name: The manifest's name for it. Another name than ``"torch"`` is a format this
            version does not know, read as plain under that name (:func:`format_of`).
        title: What messages call it.
    """

    loader = "CheckpointManager.load()"
    lists_every_file = False
    shards = False

    def __init__(self, name: str = "torch", title: str = "plain") -> None:
        self.name = name
        self.title = title
        self.label = name

    def __repr__(self) -> str:
        return f"PlainCheckpointFormat({self.name!r})"

    def can_load(self, saved: CheckpointFormat) -> bool:
        """Its own checkpoints, and sharded and DeepSpeed ones, of any world size."""
        return saved is self or (self is PLAIN and saved in (SHARDED, DEEPSPEED))

    def save(
        self,
        ckpt: Checkpoints,
        run: Checkpointable,
        run_state: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
    ) -> Path | None:
        """Rank 0 writes :func:`plain_training_state` as ``state.pt``."""
        state = plain_training_state(run_state, run.model, run.optimizer, extra)
        return ckpt.save(state, step=int(run_state["step"]))

    def load(
        self, ckpt: Checkpoints, run: Checkpointable, path: PathOrStep
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every rank reads ``state.pt``; the caller's extra is its ``"extra"``.

        A sharded checkpoint is read as :data:`SHARDED` reads it: DCP loads it into any model;
        a DeepSpeed one per parameter (``CheckpointManager.load_resharded``).
        """
        saved = format_of(ckpt.manifest(path))
        if saved is SHARDED and self is PLAIN:
            return saved.load(ckpt, run, path)
        if saved is DEEPSPEED and self is PLAIN:
            return ckpt.load_resharded(run.model, run.optimizer, path)
        state = ckpt.load(path)
        load_model_and_optimizer(state, run.model, run.optimizer)
        return state, dict(state.get("extra") or {})

    def check_contents(
        self, step_dir: Path, manifest: Mapping[str, Any], *, trusted: bool = False
    ) -> None:
        """Every ``.pt`` file, with ``weights_only`` whatever the trust."""
        check_pickles(_pickles(step_dir, manifest), hint=None)

    def saved_shapes(self, step_dir: Path, manifest: Mapping[str, Any]) -> Shapes | None:
        """From ``state.pt``, memory-mapped: no tensor is read."""
        file = step_dir / STATE_NAME
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        model_state = state.get("model_state") if isinstance(state, dict) else None
        if not isinstance(model_state, dict):
            raise CheckpointError(f"{file} holds no model state")
        return {k: tuple(v.shape) for k, v in strip_wrapper_prefixes(model_state).items()}

    def full_state(
        self, step_dir: Path, manifest: Mapping[str, Any], *, trusted: bool = False
    ) -> dict[str, Any]:
        """``state.pt``'s model and optimizer; everything else in it is the extra."""
        state = load_plain(step_dir / STATE_NAME)
        out: dict[str, Any] = {
            k: state[k] for k in ("model_state", "optimizer_state") if k in state
        }
        extra = {k: v for k, v in state.items() if k not in out}
        if extra:
            out["extra"] = extra
        return _checked(out, step_dir)

    def read_extra(self, step_dir: Path) -> dict[str, Any]:
        """``state.pt``'s ``"extra"``."""
        extra = load_plain(step_dir / STATE_NAME).get("extra")
        return dict(extra) if isinstance(extra, Mapping) else {}

    def read_run_state(self, step_dir: Path) -> dict[str, Any]:
        """``state.pt`` memory-mapped, less the model and optimizer (no tensor of them read)."""
        state = torch.load(step_dir / STATE_NAME, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(state, dict):
            raise CheckpointError(f"{step_dir / STATE_NAME} holds no run state")
        return {k: v for k, v in state.items() if k not in ("model_state", "optimizer_state")}

    def param_source(
        self, step_dir: Path, manifest: Mapping[str, Any], *, order: Order, trusted: bool = False
    ) -> ParamSource:
        """``state.pt`` memory-mapped; its optimizer state's indices are ``order``'s."""
        return PlainSource.open(step_dir, order)


class ShardedCheckpointFormat:
    """DCP shards of every rank (FSDP2), the run state in ``extra.pt``; loads on any world size."""

    name = SHARDED_FORMAT
    title = "sharded (FSDP/DCP)"
    label = f"{SHARDED_FORMAT} (sharded, torch.distributed.checkpoint)"
    loader = "CheckpointManager.load_sharded()"
    lists_every_file = True
    shards = True

    def __repr__(self) -> str:
        return "ShardedCheckpointFormat()"

    def can_load(self, saved: CheckpointFormat) -> bool:
        """Its own checkpoints, plain and DeepSpeed ones, of any world size."""
        return saved in (self, PLAIN, DEEPSPEED)

    def save(
        self,
        ckpt: Checkpoints,
        run: Checkpointable,
        run_state: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
    ) -> Path | None:
        """``dcp.save`` on every rank; the run state and extra in ``extra.pt``."""
        plain = {**(extra or {}), **run_state}
        return ckpt.save_sharded(run.model, run.optimizer, int(run_state["step"]), extra=plain)

    def load(
        self, ckpt: Checkpoints, run: Checkpointable, path: PathOrStep
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``dcp.load`` on every rank; ``extra.pt`` is both the run state and the extra.

        A plain checkpoint is broadcast from rank 0 into the shards
        (:func:`~gpu_training.checkpoint.reshard.load_plain_resharded`), a DeepSpeed one read
        per parameter (``CheckpointManager.load_resharded``).
        """
        saved = format_of(ckpt.manifest(path))
        if saved is PLAIN:
            state = ckpt.load_plain_into(run.model, run.optimizer, path)
            return state, dict(state.get("extra") or {})
        if saved is DEEPSPEED:
            return ckpt.load_resharded(run.model, run.optimizer, path)
        plain = ckpt.load_sharded(run.model, run.optimizer, path)
        return plain, plain

    def check_contents(
        self, step_dir: Path, manifest: Mapping[str, Any], *, trusted: bool = False
    ) -> None:
        """Every ``.pt`` file, and DCP's index: only the manifest's files, plain values."""
        check_pickles(_pickles(step_dir, manifest), hint=None)
        from gpu_training.checkpoint.dcp_read import check_dcp_storage  # DCP is slow to import

        check_dcp_storage(step_dir, _listed(manifest))

    def saved_shapes(self, step_dir: Path, manifest: Mapping[str, Any]) -> Shapes | None:
        """From DCP's index (each tensor's global shape)."""
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        from gpu_training.checkpoint.dcp_read import read_dcp_metadata

        metadata = read_dcp_metadata(step_dir / ".metadata")
        return {
            fqn.removeprefix("model."): tuple(meta.size)
            for fqn, meta in metadata.state_dict_metadata.items()
            if fqn.startswith("model.") and isinstance(meta, TensorStorageMetadata)
        }

    def full_state(
        self, step_dir: Path, manifest: Mapping[str, Any], *, trusted: bool = False
    ) -> dict[str, Any]:
        """Every shard, through :mod:`~gpu_training.checkpoint.dcp_read`.

        The optimizer state is keyed by parameter name.
        """
        from gpu_training.checkpoint.dcp_read import check_dcp_storage, load_everything

        check_dcp_storage(step_dir, _listed(manifest))
        loaded = load_everything(step_dir)
        out: dict[str, Any] = {"model_state": loaded.get("model")}
        if "optim" in loaded:
            out["optimizer_state"] = loaded["optim"]
        if (step_dir / EXTRA_NAME).exists():
            out["extra"] = load_plain(step_dir / EXTRA_NAME)
        return _checked(out, step_dir)

    def read_extra(self, step_dir: Path) -> dict[str, Any]:
        """``extra.pt``."""
        return _extra_file(step_dir)

    def read_run_state(self, step_dir: Path) -> dict[str, Any]:
        """``extra.pt`` (the run state and the caller's extra, in one dict)."""
        return _extra_file(step_dir)

    def param_source(
        self, step_dir: Path, manifest: Mapping[str, Any], *, order: Order, trusted: bool = False
    ) -> ParamSource:
        """DCP's files, a batch of parameters per read (its index checked first)."""
        return DcpSource(step_dir, _listed(manifest), order)


class DeepSpeedCheckpointFormat:
    """DeepSpeed's own files (ZeRO 1/2/3), the run state in ``extra.pt``; any world size."""

    name = DEEPSPEED_FORMAT
    title = "DeepSpeed"
    label = DEEPSPEED_FORMAT
    loader = "CheckpointManager.load_deepspeed()"
    lists_every_file = True
    shards = True

    def __repr__(self) -> str:
        return "DeepSpeedCheckpointFormat()"

    def can_load(self, saved: CheckpointFormat) -> bool:
        """Its own checkpoints of any stage and world size, plain and sharded ones."""
        return saved in (self, PLAIN, SHARDED)

    def save(
        self,
        ckpt: Checkpoints,
        run: Checkpointable,
        run_state: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
    ) -> Path | None:
        """``engine.save_checkpoint`` on every rank; the run state and extra in ``extra.pt``."""
        plain = {**(extra or {}), **run_state}
        return ckpt.save_deepspeed(run.engine, int(run_state["step"]), extra=plain)

    def load(
        self, ckpt: Checkpoints, run: Checkpointable, path: PathOrStep
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``engine.load_checkpoint`` where laid out alike, else per parameter; every rank.

        See ``CheckpointManager.load_into_deepspeed``.
        """
        return ckpt.load_into_deepspeed(run.engine, path)

    def check_contents(
        self, step_dir: Path, manifest: Mapping[str, Any], *, trusted: bool = False
    ) -> None:
        """DeepSpeed's files against its allow-list, unless ``trusted``; ``extra.pt`` always.

        ``extra.pt`` is read by our own ``weights_only`` loader, whatever the trust.
        """
        pickles = _pickles(step_dir, manifest)
        if not trusted:
            check_pickles([f for f in pickles if f.name != EXTRA_NAME], DEEPSPEED_SAFE_GLOBALS)
        check_pickles([f for f in pickles if f.name == EXTRA_NAME], hint=None)

    def saved_shapes(self, step_dir: Path, manifest: Mapping[str, Any]) -> Shapes | None:
        """From the model-states file's ``param_shapes`` (mapped; None if it needs trust)."""
        from gpu_training.checkpoint.zero_source import zero_shapes  # imports DeepSpeed

        return zero_shapes(step_dir)

    def full_state(
        self, step_dir: Path, manifest: Mapping[str, Any], *, trusted: bool = False
    ) -> dict[str, Any]:
        """The fp32 weights gathered by DeepSpeed's ``zero_to_fp32`` (no optimizer state)."""
        from gpu_training.checkpoint.zero_read import deepspeed_model_state  # imports DeepSpeed

        out: dict[str, Any] = {"model_state": deepspeed_model_state(step_dir, trusted=trusted)}
        if (step_dir / EXTRA_NAME).exists():
            out["extra"] = load_plain(step_dir / EXTRA_NAME)
        return _checked(out, step_dir)

    def read_extra(self, step_dir: Path) -> dict[str, Any]:
        """``extra.pt``."""
        return _extra_file(step_dir)

    def read_run_state(self, step_dir: Path) -> dict[str, Any]:
        """``extra.pt`` (the run state and the caller's extra, in one dict)."""
        return _extra_file(step_dir)

    def param_source(
        self, step_dir: Path, manifest: Mapping[str, Any], *, order: Order, trusted: bool = False
    ) -> ParamSource:
        """Every rank's ZeRO files memory-mapped, read with the allow-list unless ``trusted``."""
        from gpu_training.checkpoint.zero_source import ZeroSource  # imports DeepSpeed's classes

        return ZeroSource(step_dir, trusted=trusted)


# ----------------------------------------------------------------------------------------------
# the registry

PLAIN: CheckpointFormat = PlainCheckpointFormat()
SHARDED: CheckpointFormat = ShardedCheckpointFormat()
DEEPSPEED: CheckpointFormat = DeepSpeedCheckpointFormat()

NAMES: Mapping[str, CheckpointFormat] = MappingProxyType(
    {
        PLAIN.name: PLAIN,
        "plain": PLAIN,
        SHARDED.name: SHARDED,
        "sharded": SHARDED,
        "fsdp": SHARDED,
        DEEPSPEED.name: DEEPSPEED,
        "zero": DEEPSPEED,
    }
)
"""Every name a format goes by, the manifest's first: the one place they are resolved."""


def checkpoint_format(name: str) -> CheckpointFormat:
    """The format a name stands for (any of :data:`NAMES`).

    Raises:
        CheckpointError: One line naming the unknown name and the known ones.
    """
    found = NAMES.get(name)
    if found is None:
        raise CheckpointError(
            f"unknown checkpoint format {name!r}: expected one of {', '.join(NAMES)}"
        )
    return found


def state_format(manifest: Mapping[str, Any]) -> str:
    """The format name a manifest records: ``"dcp"``, ``"deepspeed"``, ``"torch"`` for none.

    Ask :func:`format_of` for the format itself; this is the name as written.

    Args:
        manifest: A checkpoint's parsed ``manifest.json``.
    """
    return str(manifest.get("state_format", "torch"))


def format_of(manifest: Mapping[str, Any]) -> CheckpointFormat:
    """The format of a checkpoint, from its parsed manifest.

    A manifest that names no format is plain, as every plain checkpoint is written. One that
    names a format this version does not know is read as plain — ``weights_only``, like any
    plain file — under the name it gives, so that no strategy resumes it as its own.

    Args:
        manifest: A checkpoint's parsed ``manifest.json``.
    """
    name = state_format(manifest)
    found = NAMES.get(name)
    return found if found is not None else PlainCheckpointFormat(name, title=name)
