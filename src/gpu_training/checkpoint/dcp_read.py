"""Reading ``torch.distributed.checkpoint`` (DCP) directories without trusting their pickles.

DCP stores its index, ``.metadata``, as a pickle and unpickles non-tensor values (optimizer
hyper-parameters...) with ``weights_only=False``. Everything that touches those bytes is
here, in one place to audit: the allowlisting unpickler for ``.metadata``, the check that
the index reads only the checkpoint's own files (:func:`check_dcp_storage`), a
``FileSystemReader`` that uses it, a load planner that checks every non-tensor value with
``torch.load(weights_only=True)`` before DCP unpickles it, and :func:`load_everything`, the
whole-checkpoint read that offline consolidation uses (no process group, no model), with
:func:`load_keys` for a few values at a time (what resharding into DeepSpeed reads). It is a
module of its own because it is the trust boundary of sharded checkpoints: both the
every-rank load (:func:`~gpu_training.checkpoint.sharded.load_sharded`) and the offline one
(:func:`~gpu_training.checkpoint.offline.consolidate`) go through it.

DCP's own ``torch.load`` calls also run forced to ``weights_only``
(:func:`~gpu_training.checkpoint.safe_load.weights_only_loads`), so a pickle payload in any
file of a sharded checkpoint is refused and never runs. DCP's format was not designed for
hostile input in other ways (sizes, offsets): for weights from a stranger a ``.safetensors``
file is still the better thing to ask for.

Example:
    >>> import pickle, tempfile, warnings
    >>> import torch
    >>> import torch.distributed.checkpoint as dcp
    >>> step_dir = Path(tempfile.mkdtemp())
    >>> with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
    ...     warnings.simplefilter("ignore")
    ...     _ = dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=step_dir)
    >>> load_everything(step_dir)["model"]["w"].tolist()
    [1.0, 1.0]
    >>> _ = (step_dir / ".metadata").write_bytes(pickle.dumps(print))  # not DCP's metadata
    >>> try:
    ...     load_everything(step_dir)
    ... except CheckpointError as exc:
    ...     print(exc)
    refused to read .../.metadata: UnpicklingError: builtins.print is not a DCP metadata type; ...
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from gpu_training.checkpoint.attempt import CAUGHT, describe_error
from gpu_training.checkpoint.files import CheckpointError
from gpu_training.checkpoint.safe_load import refused_message, weights_only_loads

__all__ = ["check_dcp_storage", "load_everything", "load_keys", "read_dcp_metadata"]

_DCP_METADATA = ".metadata"


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


def read_dcp_metadata(path: Path) -> Metadata:
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


def check_dcp_storage(step_dir: Path, files: Iterable[str]) -> None:
    """A DCP checkpoint's index reads only its own ``files``, and its pickled values are data.

    DCP's ``.metadata`` says which file and byte range holds each value, and DCP opens
    ``step_dir / relative_path`` as written: a hostile index could read any file on the
    machine into the weights. Its non-tensor values are unpickled with ``weights_only=False``
    by DCP: each is checked here with ``weights_only=True`` first (the load planners check
    them again), so that the refusal names the file before any reader starts.

    Args:
        step_dir: A sharded (``"dcp"``) step directory.
        files: The names its manifest lists (and vouches for).

    Raises:
        CheckpointError: The index names a file outside ``files``, or a value holds objects
            outside the ``weights_only`` allow-list (nothing is executed), naming both.
    """
    metadata = read_dcp_metadata(step_dir / ".metadata")
    listed = set(files)
    values = {
        fqn
        for fqn, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, BytesStorageMetadata)
    }
    for index, info in (metadata.storage_data or {}).items():
        name = str(info.relative_path)
        if name not in listed:
            raise CheckpointError(
                f"{step_dir / '.metadata'}: {index.fqn!r} is stored in {name!r}, which is not "
                "a file of this checkpoint's manifest (refusing to read outside it)"
            )
        if index.fqn not in values or getattr(info, "transform_descriptors", None):
            continue  # tensors load with weights_only; transformed bytes: the planner checks
        with open(step_dir / name, "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        try:
            torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        except Exception as exc:
            refusal = refused_message(step_dir / name, exc, hint=None)
            detail = (refusal or "").removeprefix("refused to read ") or (
                f"{step_dir / name}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            )
            raise CheckpointError(f"refused to load {index.fqn!r} from {detail}") from exc


class SafeReader(FileSystemReader):
    """A ``FileSystemReader`` whose metadata goes through :func:`read_dcp_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = _DCP_METADATA if rank is None else f"__{rank}{_DCP_METADATA}"
        metadata = read_dcp_metadata(Path(self.path) / name)
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id  # what FileSystemReader.read_metadata does too
        metadata.storage_meta = storage_meta
        return metadata


def _check_bytes(read_item: ReadItem, value: io.BytesIO, where: str) -> None:
    """Refuses a non-tensor value that ``torch.load(weights_only=True)`` would not build.

    DCP unpickles non-tensor values (optimizer hyper-parameters...) with
    ``weights_only=False``, so this check runs first, on the same bytes.
    """
    try:
        torch.load(value, map_location="cpu", weights_only=True)
    except Exception as exc:
        message = refused_message(f"{where} (value {read_item.dest_index.fqn!r})", exc, hint=None)
        if message is None:
            message = (
                f"could not read {where} (value {read_item.dest_index.fqn!r}): "
                f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            )
        raise CheckpointError(message) from exc
    value.seek(0)


def _file_of(planner: Any, read_item: ReadItem) -> str:
    """The checkpoint file a value is read from, as the index names it."""
    storage = getattr(getattr(planner, "metadata", None), "storage_data", None) or {}
    info = storage.get(read_item.storage_index)
    return str(info.relative_path) if info is not None else "a file of the checkpoint"


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, checking every non-tensor value with ``weights_only`` first."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _check_bytes(read_item, value, _file_of(self, read_item))
        super().load_bytes(read_item, value)


def load_everything(path: Path) -> dict[str, Any]:
    """Loads a whole sharded checkpoint into this process: no process group, no model.

    Used by :func:`~gpu_training.checkpoint.offline.consolidate`; needs the whole state
    in CPU memory. Nothing in the directory is unpickled beyond the allow-lists (see the
    module docstring).

    Args:
        path: A sharded step directory (verify it against its manifest first).

    Returns:
        ``{"model": {...}, "optim": {...}}`` as saved, full tensors on the CPU.

    Raises:
        CheckpointError: If the metadata or a value is refused or a file cannot be read.
    """
    return load_keys(path, None)


def load_keys(path: Path, keys: Iterable[str] | None) -> dict[str, Any]:
    """Loads some values of a sharded checkpoint into this process, whole: no process group.

    Args:
        path: A sharded step directory (verify it against its manifest first).
        keys: Dotted names of the values, or of a mapping holding them
            (``"model.wte.weight"``, ``"optim.state.wte.weight"``); None for everything.

    Returns:
        The values asked for, nested as saved (``{"model": {"wte.weight": ...}}``).

    Raises:
        CheckpointError: If the metadata or a value is refused or a file cannot be read.
    """
    # dcp.load keeps only the caller's top-level keys, so an empty template would come back
    # empty: this is the private path torch's own dcp_to_torch_save takes.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class _SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            _check_bytes(read_item, value, str(path / _file_of(self, read_item)))
            super().load_bytes(read_item, value)

    read_dcp_metadata(path / _DCP_METADATA)  # a clear error before DCP's own fallbacks
    state: dict[str, Any] = {}
    wanted = None if keys is None else set(keys)
    try:
        with weights_only_loads():
            _load_state_dict(
                state,
                storage_reader=SafeReader(path),
                planner=_SafeEmptyPlanner(keys=wanted),
                no_dist=True,
            )
    except CAUGHT as exc:
        raise CheckpointError(f"could not read {path}: {describe_error(exc)}") from exc
    return state
