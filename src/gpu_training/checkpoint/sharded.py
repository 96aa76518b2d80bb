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

Saving: rank 0 creates one temporary directory and broadcasts its name; every rank writes its
shards there (``dcp.save``); each rank checksums the files it wrote; rank 0 writes the
manifest, fsyncs, renames the directory into place and prunes. An error on any rank reaches
every rank as :class:`CheckpointError`, the temporary directory is removed and nothing is
pruned. The directory must be on a file system every rank sees (one node, or NFS/Lustre...).

Loading reshards: a checkpoint saved by 8 ranks loads on 2, on 1 without a process group, or
into a plain (unsharded) model, because DCP stores each tensor's global shape and chunks.

``extra`` is stored apart from DCP, in ``extra.pt`` written by rank 0 and read back with
``torch.load(weights_only=True)``: DCP would keep an arbitrary rank's copy of non-tensor
values and unpickles them with ``weights_only=False``.

Trust: DCP's ``.metadata`` is a pickle. This module reads it with an unpickler that only
builds DCP's own metadata classes, and checks every non-tensor value with
``torch.load(weights_only=True)`` before DCP unpickles it, but DCP's file format was not
designed for hostile input: **treat sharded checkpoint directories as trusted input only**.
For weights from an untrusted source, ask for a ``.safetensors`` file.

Example:
    >>> ckpt = CheckpointManager("checkpoints", ctx=ctx, keep_last_n=3)  # doctest: +SKIP
    >>> ckpt.save_sharded(model, optimizer, step, extra={"step": step})  # doctest: +SKIP
    >>> extra = ckpt.load_sharded(model, optimizer)  # every rank, any world size  # doctest: +SKIP

One plain file for inference: :func:`~gpu_training.checkpoint.offline.consolidate`
(``gpu-training ckpt consolidate``).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import (
    CheckpointException,
    DefaultLoadPlanner,
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from gpu_training.checkpoint.files import (
    DEEPSPEED_FORMAT,
    EXTRA_NAME,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SHARDED_FORMAT,
    CheckpointError,
    _check_step,
    _checksum_mismatch,
    _file_checksum,
    _fsync_dir,
    _inspect,
    _make_locked_tmp,
    _step_name,
)
from gpu_training.checkpoint.offline import load_plain, state_format
from gpu_training.ddp import DistributedContext

if TYPE_CHECKING:
    from gpu_training.checkpoint.manager import CheckpointManager

__all__ = ["EXTRA_NAME", "SHARDED_FORMAT", "load_everything", "load_sharded", "save_sharded"]

_DCP_METADATA = ".metadata"
# DCP names rank r's files "__r_<n>.distcp"; DeepSpeed "[bf16_]zero_pp_rank_r_mp_rank_00_*.pt"
_RANK_FILE_RE = re.compile(r"__(\d+)_|zero_pp_rank_(\d+)_")
_CAUGHT = (Exception, CheckpointException)  # CheckpointException is a BaseException
_NO_DIST_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


# ----------------------------------------------------------------------------------------------
# safer reading of DCP files


def _metadata_globals() -> dict[tuple[str, str], Any]:
    import pathlib

    import torch.distributed.checkpoint.filesystem as dcp_fs
    import torch.distributed.checkpoint.metadata as dcp_md

    allowed: dict[tuple[str, str], Any] = {
        ("torch", "Size"): torch.Size,
        ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): dcp_fs._StorageInfo,
        ("collections", "OrderedDict"): __import__("collections").OrderedDict,
    }
    for name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"):
        allowed[("pathlib", name)] = getattr(pathlib, name)
    for name, value in vars(dcp_md).items():
        if isinstance(value, type) and value.__module__ == dcp_md.__name__:
            allowed[(dcp_md.__name__, name)] = value
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            allowed[("torch", name)] = value
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes, torch sizes and dtypes; refuses every other global."""

    _allowed: dict[tuple[str, str], Any] | None = None

    def find_class(self, module: str, name: str) -> Any:
        if _MetadataUnpickler._allowed is None:
            _MetadataUnpickler._allowed = _metadata_globals()
        found = _MetadataUnpickler._allowed.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"{module}.{name} is not a DCP metadata type; refusing to unpickle it"
            )
        return found


def _read_metadata(path: Path) -> Metadata:
    """Reads a DCP ``.metadata`` file with :class:`_MetadataUnpickler`."""
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (not a DCP checkpoint)") from None
    except Exception as exc:
        raise CheckpointError(f"refused to read {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path} holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


class _SafeReader(FileSystemReader):
    """A ``FileSystemReader`` whose metadata goes through :func:`_read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = _DCP_METADATA if rank is None else f"__{rank}{_DCP_METADATA}"
        metadata = _read_metadata(Path(self.path) / name)
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id  # what FileSystemReader.read_metadata does too
        metadata.storage_meta = storage_meta
        return metadata


def _check_bytes(read_item: ReadItem, value: io.BytesIO) -> None:
    """Refuses a non-tensor value that ``torch.load(weights_only=True)`` would not build.

    DCP unpickles non-tensor values (optimizer hyper-parameters...) with
    ``weights_only=False``, so this check runs first, on the same bytes.
    """
    try:
        torch.load(value, map_location="cpu", weights_only=True)
    except Exception as exc:
        reason = " ".join(str(exc).split())[:400]
        raise CheckpointError(
            f"refused to load {read_item.dest_index.fqn!r}: not a plain value "
            f"(torch.load weights_only=True says: {reason})"
        ) from exc
    value.seek(0)


class _SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _check_bytes(read_item, value)
        super().load_bytes(read_item, value)


def load_everything(path: Path) -> dict[str, Any]:
    """Loads a whole sharded checkpoint into this process: no process group, no model.

    Used by :func:`~gpu_training.checkpoint.offline.consolidate`; needs the whole state
    in CPU memory. Trusted input only (see the module docstring).

    Args:
        path: A sharded step directory (verify it against its manifest first).

    Returns:
        ``{"model": {...}, "optim": {...}}`` as saved, full tensors on the CPU.

    Raises:
        CheckpointError: If the metadata or a value is refused or a file cannot be read.
    """
    # dcp.load keeps only the caller's top-level keys, so an empty template would come back
    # empty: this is the private path torch's own dcp_to_torch_save takes.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class _SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            _check_bytes(read_item, value)
            super().load_bytes(read_item, value)

    _read_metadata(path / _DCP_METADATA)  # a clear error before DCP's own fallbacks
    state: dict[str, Any] = {}
    try:
        _load_state_dict(
            state, storage_reader=_SafeReader(path), planner=_SafeEmptyPlanner(), no_dist=True
        )
    except _CAUGHT as exc:
        raise CheckpointError(f"could not read {path}: {_describe(exc)}") from exc
    return state


# ----------------------------------------------------------------------------------------------
# cross-rank error handling


def _describe(exc: BaseException, stack: traceback.StackSummary | None = None) -> str:
    """One line for an exception, with where it was raised unless it is our own error.

    DCP's CheckpointException carries each failed rank's exception and stack: each is listed.
    """
    if isinstance(exc, CheckpointException):
        parts = []
        for rank, wrapped in sorted(exc.failures.items()):
            inner, inner_stack = wrapped if isinstance(wrapped, tuple) else (wrapped, None)
            parts.append(f"rank {rank}: {_describe(inner, inner_stack)}")
        return "; ".join(parts) or "DCP reported a failure"
    if isinstance(exc, CheckpointError):
        return str(exc)
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    frames = stack or traceback.extract_tb(exc.__traceback__)
    if frames:  # "KeyError: 0" alone says nothing: name the line that raised it
        last = frames[-1]
        text += f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
    return text


class _Attempt:
    """Catches what one rank's part of a phase raises, to share it before anyone raises."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.interrupt: BaseException | None = None

    def __enter__(self) -> _Attempt:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None:
            return False
        self.error = _describe(exc)
        if not isinstance(exc, _CAUGHT):  # KeyboardInterrupt: re-raised after the exchange
            self.interrupt = exc
        return True


def _distributed(ctx: DistributedContext) -> bool:
    if not ctx.is_distributed:
        return False
    if not (dist.is_available() and dist.is_initialized()):
        raise CheckpointError(
            f"rank {ctx.rank} of {ctx.world_size}: sharded checkpoints need the process group; "
            "call init_distributed() first"
        )
    return True


def _settle(
    ctx: DistributedContext, attempt: _Attempt, what: str, payload: Any = None
) -> list[Any]:
    """Every rank's payload; raises on every rank if any rank's attempt failed.

    The exchange is also a barrier, so a rank that failed early cannot leave the others
    blocked in a collective it never joins.
    """
    statuses: list[Any] = [(attempt.error, payload)]
    if _distributed(ctx):
        statuses = [None] * ctx.world_size
        dist.all_gather_object(statuses, (attempt.error, payload))
    if attempt.interrupt is not None:
        raise attempt.interrupt
    failed = [(rank, err) for rank, (err, _) in enumerate(statuses) if err is not None]
    if failed:
        if ctx.is_distributed:
            raise CheckpointError(f"{what}: " + "; ".join(f"rank {r}: {e}" for r, e in failed))
        raise CheckpointError(f"{what}: {failed[0][1]}")
    return [p for _, p in statuses]


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


def _check_plain(values: Any, what: str) -> None:
    """Refuses values that ``torch.load(weights_only=True)`` could not read back."""
    buffer = io.BytesIO()
    torch.save(values, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = " ".join(str(exc).split())[:400]
        raise CheckpointError(
            f"{what} holds objects that torch.load(weights_only=True) refuses, so it could "
            f"never be loaded; use tensors, numbers, strings and lists/dicts of them. "
            f"torch says: {reason}"
        ) from exc


def _write_extra(tmp: Path, extra: Mapping[str, Any]) -> None:
    """Writes ``extra.pt`` durably after checking that it loads with ``weights_only=True``."""
    _check_plain(dict(extra), "extra")
    with open(tmp / EXTRA_NAME, "wb") as f:
        torch.save(dict(extra), cast(IO[bytes], f))
        f.flush()
        os.fsync(f.fileno())


def _own_files(tmp: Path, ctx: DistributedContext) -> list[dict[str, Any]]:
    """Size and checksum of the files this rank answers for (its own shards; rank 0: the rest)."""
    entries = []
    with os.scandir(tmp) as found:
        names = sorted(e.name for e in found if e.is_file(follow_symlinks=False))
    for name in names:
        match = _RANK_FILE_RE.search(name)
        owner = int(match.group(1) or match.group(2)) % ctx.world_size if match else 0
        if owner != ctx.rank:
            continue
        file = tmp / name
        # hashed by the rank that wrote it, while it is still in that node's page cache
        entries.append(
            {
                "name": name,
                "size": file.stat().st_size,
                "checksum": _file_checksum(file),
            }
        )
    return entries


def _manifest(
    manager: CheckpointManager, step: int, entries: list[dict[str, Any]], fmt: str
) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "state_format": fmt,
        "step": step,
        "world_size": manager.ctx.world_size,
        "config_hash": manager.config_hash,
        "created": datetime.now(timezone.utc).isoformat(),
        "torch_version": torch.__version__,
        "metadata": {},
        "files": sorted(entries, key=lambda e: str(e["name"])),
    }


def _commit_sharded(
    manager: CheckpointManager,
    tmp: Path,
    step: int,
    entries: list[dict[str, Any]],
    written: set[str],
    fmt: str = SHARDED_FORMAT,
) -> Path:
    """Rank 0: cross-checks the ranks' files, writes the manifest last, renames."""
    listed = {str(e["name"]) for e in entries}
    with os.scandir(tmp) as found:
        present = {e.name for e in found}
    if present != listed:
        raise CheckpointError(
            f"the files in {tmp} seen by rank 0 ({sorted(present - listed)} unaccounted for, "
            f"{sorted(listed - present)} missing) differ from what the ranks wrote: is "
            f"{manager.directory} on a file system every rank shares?"
        )
    if not written <= listed:
        raise CheckpointError(f"the writer names files not in {tmp}: {written - listed}")
    for entry in entries:
        size = (tmp / str(entry["name"])).stat().st_size
        if size != entry["size"]:
            raise CheckpointError(f"{tmp / entry['name']}: {size} bytes, expected {entry['size']}")
    manifest = _manifest(manager, step, entries, fmt)
    # the manifest is written last: without it the directory is not a checkpoint
    with open(tmp / MANIFEST_NAME, "wb") as f:
        f.write(json.dumps(manifest, indent=2).encode())
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    final = manager.directory / _step_name(step)
    manager._commit(tmp, final)
    _fsync_dir(manager.directory)
    return final


def save_sharded(
    manager: CheckpointManager,
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
    are pruned. Call it on every rank. Usually called as ``manager.save_sharded(...)``.

    Args:
        manager: Where and how to save (directory, rank identity, ``keep_last_n``).
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
        _check_plain(list(_plain_leaves(state)), "the model and optimizer state")

    def write(tmp: Path) -> set[str]:
        with _quiet_single_process():
            metadata = dcp.save(state, storage_writer=FileSystemWriter(tmp))
        return {info.relative_path for info in (metadata.storage_data or {}).values()}

    return save_directory(manager, step, write, SHARDED_FORMAT, extra=extra, prepare=gather)


def save_directory(
    manager: CheckpointManager,
    step: int,
    write: Callable[[Path], set[str]],
    fmt: str,
    *,
    extra: Mapping[str, Any] | None = None,
    prepare: Callable[[], None] | None = None,
) -> Path | None:
    """The commit protocol of a checkpoint that every rank writes files into; every rank.

    Rank 0 makes a locked temporary directory and shares its name; ``prepare()`` runs on
    every rank (and rank 0 writes ``extra``) — an error there reaches every rank before any
    collective in ``write``; ``write(tmp)`` writes this rank's files into ``tmp`` (flat) and
    returns the names it knows were written (checked to exist); each rank checksums its own
    files; rank 0 writes the manifest (``"state_format": fmt``) last, renames, prunes.

    Args:
        manager: Where and how to save.
        step: The step number (>= 0).
        write: Writes the state into the directory it is given; called on every rank.
        fmt: The manifest's ``state_format``.
        extra: Plain state saved by rank 0 in ``extra.pt`` (``weights_only``-loadable).
        prepare: Work that may fail per rank before ``write``'s collectives start.

    Returns:
        The checkpoint directory on rank 0, None on the other ranks.

    Raises:
        CheckpointError: On every rank if any rank failed; the temporary directory is
            removed and nothing is pruned.
        ValueError: If ``step`` is not an integer >= 0.
        TypeError: If ``extra`` is not a mapping.
    """
    _check_step(step)
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"extra must be a mapping (a dict), got {type(extra).__name__}")
    ctx = manager.ctx
    _distributed(ctx)
    manager.wait()  # a pending asynchronous plain save commits (and prunes) first
    what = f"could not save step {step} to {manager.directory}"
    tmp: Path | None = None
    lock_fd: int | None = None
    committed = False

    def settle(attempt: _Attempt, payload: Any = None) -> list[Any]:
        try:
            return _settle(ctx, attempt, what, payload)
        except CheckpointError:
            # Rank 0 removes its temporary directory before *any* rank reports the failure:
            # a caller that looks right after the error must find nothing half-written.
            if tmp is not None and not committed:
                shutil.rmtree(tmp, ignore_errors=True)
            if _distributed(ctx):
                dist.barrier()
            raise

    try:
        with _Attempt() as setup:
            if ctx.is_main_process:
                if not manager.directory.is_dir():
                    manager.directory.mkdir(parents=True, exist_ok=True)
                    _fsync_dir(manager.directory.parent)
                tmp, lock_fd = _make_locked_tmp(manager.directory, _step_name(step))
        name = settle(setup, tmp.name if tmp is not None else None)[0]
        shared_tmp = manager.directory / str(name)

        with _Attempt() as gather:
            if prepare is not None:
                prepare()
            if ctx.is_main_process and extra is not None:
                _write_extra(shared_tmp, extra)
        settle(gather)  # before write: its collectives need every rank

        written: set[str] = set()
        entries: list[dict[str, Any]] = []
        with _Attempt() as attempt:
            written = write(shared_tmp)
            entries = _own_files(shared_tmp, ctx)
        every = settle(attempt, entries)

        final: Path | None = None
        with _Attempt() as commit:
            if ctx.is_main_process:
                final = _commit_sharded(
                    manager, shared_tmp, step, [e for es in every for e in es], written, fmt
                )
                committed = True
                manager._prune(keep=final)  # only after a commit; failures there only warn
        settle(commit)
        return final
    finally:
        if tmp is not None and not committed:  # every rank has stopped writing by now
            shutil.rmtree(tmp, ignore_errors=True)
        if lock_fd is not None:
            os.close(lock_fd)


# ----------------------------------------------------------------------------------------------
# loading


def _verify_shared(ctx: DistributedContext, path: Path, manifest: dict[str, Any]) -> list[str]:
    """Checksums ``path``'s files, each rank a share of them; every rank gets all problems."""
    problems: list[str] = []
    with _Attempt() as check:
        for i, entry in enumerate(manifest["files"]):
            if i % ctx.world_size != ctx.rank:
                continue
            file = path / entry["name"]
            try:
                size = file.stat().st_size
            except OSError:
                problems.append(f"{file}: listed in the manifest but missing")
                continue
            if size != entry["size"]:
                problems.append(f"{file}: {size} bytes, the manifest says {entry['size']}")
            elif _checksum_mismatch(file, entry["checksum"]):
                problems.append(
                    f"{file}: checksum mismatch, the manifest says {entry['checksum']} "
                    "(the file is corrupted)"
                )
    every = _settle(ctx, check, f"could not verify {path}", problems)
    return [p for rank_problems in every for p in rank_problems]


_FORMAT_LOADERS = {
    SHARDED_FORMAT: "CheckpointManager.load_sharded()",
    DEEPSPEED_FORMAT: "CheckpointManager.load_deepspeed()",
}


_FORMAT_NAMES = {SHARDED_FORMAT: "sharded (DCP)", DEEPSPEED_FORMAT: "DeepSpeed"}


def _loader_for(fmt: str) -> str:
    return _FORMAT_LOADERS.get(fmt, "CheckpointManager.load()")


def _kind(fmt: str) -> str:
    return _FORMAT_NAMES.get(fmt, "plain")


def _candidates(
    manager: CheckpointManager, path_or_step: str | os.PathLike[str] | int | None, fmt: str
) -> list[tuple[Path, dict[str, Any]]]:
    """Rank 0's view: (step dir, manifest) to try, newest first; raises if there are none."""
    if path_or_step is not None:
        path = manager._resolve(path_or_step)
        manifest, problems = _inspect(path, checksums=False)
        if manifest is None or problems:
            raise CheckpointError(f"refusing to load {path}: " + "; ".join(problems))
        found = state_format(manifest)
        if found != fmt:
            raise CheckpointError(
                f"{path} is a {_kind(found)} checkpoint, not {_kind(fmt)}: load it with "
                f"{_loader_for(found)}, not {_loader_for(fmt)}"
            )
        return [(path, manifest)]
    found_dirs = []
    for _, path in reversed(manager._step_dirs()):
        manifest, problems = _inspect(path, checksums=False)
        if manifest is not None and not problems and state_format(manifest) == fmt:
            found_dirs.append((path, manifest))
    if not found_dirs:
        raise CheckpointError(f"no committed {_kind(fmt)} checkpoint in {manager.directory}")
    return found_dirs


def choose_verified(
    manager: CheckpointManager, path_or_step: str | os.PathLike[str] | int | None, fmt: str
) -> Path:
    """The checkpoint of format ``fmt`` to load, its checksums verified; every rank.

    Each rank checksums a share of the files. With no ``path_or_step`` the newest one that
    verifies is taken, with a warning about newer ones that do not.

    Raises:
        CheckpointError: On every rank, if there is none, or the one asked for is damaged
            or of another format.
    """
    ctx = manager.ctx
    what = f"could not load a {_kind(fmt)} checkpoint from {manager.directory}"
    candidates: list[tuple[Path, dict[str, Any]]] = []
    with _Attempt() as find:
        if ctx.is_main_process:
            candidates = _candidates(manager, path_or_step, fmt)
    candidates = _settle(ctx, find, what, candidates)[0]

    skipped: list[str] = []
    for path, manifest in candidates:
        problems = _verify_shared(ctx, path, manifest)
        if not problems:
            if skipped and ctx.is_main_process:
                warnings.warn(
                    f"loading {path}; skipped newer checkpoints that failed verification: "
                    + "; ".join(skipped),
                    stacklevel=4,
                )
            return path
        if path_or_step is not None:
            raise CheckpointError(f"refusing to load {path}: " + "; ".join(problems))
        skipped += problems
    raise CheckpointError(
        f"no valid {fmt!r} checkpoint in {manager.directory}: " + "; ".join(skipped)
    )


def load_sharded(
    manager: CheckpointManager,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    path_or_step: str | os.PathLike[str] | int | None = None,
) -> dict[str, Any]:
    """Loads a sharded checkpoint into ``model`` and ``optimizer`` in place; every rank.

    Works on any world size and sharding: a checkpoint saved by N ranks loads on M ranks
    (FSDP2 or not) and in a single process without a process group, into a plain model. Each
    rank checksums a share of the files first; with no ``path_or_step`` it takes the newest
    sharded checkpoint that verifies, warning about newer ones that do not. Usually called as
    ``manager.load_sharded(...)``. Build the optimizer before loading (its state is filled in).

    Sharded checkpoints are **trusted input only**: DCP's ``.metadata`` is a pickle. It is
    read here with an allowlisting unpickler and non-tensor values are checked with
    ``weights_only=True`` first, but do not load directories from people you do not trust.

    Args:
        manager: The checkpoint directory and this rank's identity.
        model: The model to fill, sharded with ``fully_shard`` or not.
        optimizer: Its optimizer, or None to load the model weights only.
        path_or_step: A checkpoint directory, a step number, or None for the newest.

    Returns:
        The ``extra`` state saved with the checkpoint (an empty dict if there was none).

    Raises:
        CheckpointError: On every rank, if there is no checkpoint, it fails verification, is a
            plain checkpoint, does not match the model or optimizer, or any rank failed.
    """
    ctx = manager.ctx
    _distributed(ctx)
    chosen = choose_verified(manager, path_or_step, SHARDED_FORMAT)
    what = f"could not load {chosen}"

    state: dict[str, Any] = {}
    with _Attempt() as prepare:
        _read_metadata(chosen / _DCP_METADATA)
        state = _training_state(model, optimizer)
    _settle(ctx, prepare, what)  # before dcp.load: its collectives need every rank

    extra: dict[str, Any] = {}
    with _Attempt() as load:
        with _quiet_single_process():
            dcp.load(state, storage_reader=_SafeReader(chosen), planner=_SafeLoadPlanner())
        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            set_state_dict(
                model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
        if (chosen / EXTRA_NAME).exists():
            extra = load_plain(chosen / EXTRA_NAME)
    _settle(ctx, load, what)
    return extra
