"""Checkpoint directories offline: find, inspect, verify and consolidate, without a manager.

For use outside a training job (no process group, no model). Everything here is read-only on
the checkpoint directory — unlike :meth:`CheckpointManager.latest`, nothing is cleaned up —
and works on every format alike: what differs, it asks the manifest's format
(:func:`~gpu_training.checkpoint.formats.format_of`). It backs ``gpu-training ckpt inspect /
verify / consolidate``:

- :func:`find_checkpoint`, :func:`read_manifest`: a step directory, or a root's newest
  committed one, and its manifest; :func:`inspect_step`: one step directory checked against
  its manifest, the check every reader of the package runs;
- :func:`verify_checkpoints`: sizes and checksums of one step or every step;
- :func:`consolidate`: one ``.safetensors`` or ``.pt`` file with unwrapped keys, loadable into
  a plain model, written atomically.

``torch.distributed.checkpoint`` is imported only to consolidate a sharded checkpoint.
Checkpoints are data from a possibly hostile source: every file is read with
``weights_only=True`` or an allow-list (DCP's pickled ``.metadata``, DeepSpeed's optimizer
files: :mod:`~gpu_training.checkpoint.safe_load`), a manifest's file names never leave the
step directory, and symbolic links in it are refused (:func:`verify_checkpoints` names them).

Example:
    >>> import tempfile, torch
    >>> from gpu_training.checkpoint import CheckpointManager
    >>> from gpu_training.ddp import DistributedContext
    >>> root = Path(tempfile.mkdtemp())
    >>> model = torch.nn.Linear(2, 1)
    >>> ckpt = CheckpointManager(root, ctx=DistributedContext())
    >>> _ = ckpt.save({"model_state": model.state_dict(), "epoch": 1}, step=3)
    >>> step_dir, manifest = read_manifest(root)  # the newest committed step
    >>> step_dir.name, manifest["step"], format_of(manifest).title
    ('step-00000003', 3, 'plain')
    >>> verify_checkpoints(root)  # step dir -> problems
    {PosixPath('.../step-00000003'): []}
    >>> out = consolidate(root, root / "model.pt")  # the model weights, nothing else
    >>> sorted(torch.load(out, weights_only=True))
    ['bias', 'weight']
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, NamedTuple, cast

import torch

from gpu_training.checkpoint.files import (
    MANIFEST_NAME,
    STEP_RE,
    CheckpointError,
    entry_problem,
    fsync_dir,
    manifest_problems,
    scan_step_dirs,
)
from gpu_training.checkpoint.formats import format_of, state_format
from gpu_training.checkpoint.safe_load import load_plain

__all__ = [
    "CONSOLIDATED_SUFFIXES",
    "Resumable",
    "consolidate",
    "find_checkpoint",
    "find_resumable",
    "inspect_step",
    "load_plain",
    "read_manifest",
    "state_format",
    "verify_checkpoints",
]

CONSOLIDATED_SUFFIXES = (".safetensors", ".pt", ".pth")
"""Output file types :func:`consolidate` writes."""


# ----------------------------------------------------------------------------------------------
# finding and checking checkpoints (read-only: nothing is cleaned up)


def _unlisted_problems(path: Path, manifest: Mapping[str, Any]) -> list[str]:
    """Files in the step directory that the manifest does not vouch for, where that matters.

    The DCP and DeepSpeed readers glob the directory (``*_optim_states.pt``...), so a file
    nobody checksummed would be read unverified (the format's ``lists_every_file``).
    """
    if not format_of(manifest).lists_every_file:
        return []
    listed = {entry["name"] for entry in manifest["files"]} | {MANIFEST_NAME}
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        return [f"{path}: cannot list it ({exc.strerror})"]
    return [
        f"{path / name}: not listed in the manifest (its reader would read it unverified)"
        for name in names
        if name not in listed
    ]


def inspect_step(path: Path, *, checksums: bool) -> tuple[dict[str, Any] | None, list[str]]:
    """Reads and checks ``path``'s manifest and files; returns (manifest or None, problems).

    Args:
        path: A step directory.
        checksums: Also hash every file (one read of each); else sizes only.
    """
    if not path.is_dir():
        return None, [f"{path}: no such checkpoint directory"]
    manifest_path = path / MANIFEST_NAME
    if manifest_path.is_symlink():
        return None, [f"{manifest_path}: a symbolic link (a checkpoint's files must be inside it)"]
    try:
        manifest = json.loads(manifest_path.read_bytes())
    except FileNotFoundError:
        return None, [f"{manifest_path}: missing (the checkpoint was never committed)"]
    except (OSError, ValueError) as exc:
        return None, [f"{manifest_path}: unreadable ({exc})"]
    problems = manifest_problems(manifest, path)
    if problems:
        return None, problems
    for entry in manifest["files"]:
        problem = entry_problem(path, entry, checksums=checksums)
        if problem is not None:
            problems.append(problem)
    problems += _unlisted_problems(path, manifest)
    return manifest, problems


def _is_step_dir(path: Path) -> bool:
    return STEP_RE.fullmatch(path.name) is not None or (path / MANIFEST_NAME).exists()


def _step_dirs(root: Path) -> list[Path]:
    return [path for _, path in scan_step_dirs(root)]


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The step directory ``path`` names, or the newest committed one under a root directory.

    Read-only, unlike :meth:`CheckpointManager.latest`: stale ``.tmp-*`` directories are left.

    Args:
        path: A ``step-XXXXXXXX`` directory (or any directory with a ``manifest.json``), or a
            checkpoint root holding such directories.

    Returns:
        The step directory (for a root: the newest whose manifest and file sizes check out).

    Raises:
        CheckpointError: If ``path`` is not a directory or a root holds no committed checkpoint.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if _is_step_dir(path):
        return path
    steps = _step_dirs(path)
    damaged: list[str] = []
    for step_dir in reversed(steps):
        problems = inspect_step(step_dir, checksums=False)[1]
        if not problems:
            return step_dir
        damaged.append(f"{step_dir.name}: {problems[0]}")
    if not steps:
        raise CheckpointError(f"{path}: no checkpoint (no step-XXXXXXXX directory)")
    more = f"; and {len(damaged) - 3} more" if len(damaged) > 3 else ""
    raise CheckpointError(
        f"{path}: none of its {len(steps)} step directories is committed and intact "
        f"({'; '.join(damaged[:3])}{more})"
    )


class Resumable(NamedTuple):
    """Where a run would resume, and what stands in the way (:func:`find_resumable`)."""

    latest: Path | None
    """The newest step directory that verifies; None when there is none."""
    damaged: list[tuple[Path, list[str]]]
    """Step directories newer than ``latest`` that fail verification, with their problems."""

    def refusal(self, directory: str | os.PathLike[str]) -> str | None:
        """The one-line refusal when damaged checkpoints stand in the way, else None.

        A run resuming behind a damaged checkpoint would overwrite it when it reaches its
        step, and starting at step 0 would overwrite them all: neither happens silently.

        Args:
            directory: The checkpoint root, as the user named it.
        """
        if not self.damaged:
            return None
        root = Path(directory)
        names = " ".join(shlex.quote(str(path)) for path, _ in self.damaged)
        detail = "; ".join(f"{path.name}: {problems[0]}" for path, problems in self.damaged)
        then = (
            f"it then resumes from {self.latest.name}"
            if self.latest is not None
            else "it then starts at step 0"
        )
        return (
            f"{len(self.damaged)} damaged checkpoint(s) in {root} newer than any intact one "
            f"({detail}); they are never overwritten or skipped: move them aside with "
            f"'mkdir -p {shlex.quote(str(root / 'damaged'))} && mv {names} "
            f"{shlex.quote(str(root / 'damaged'))}/' and run again ({then})"
        )


def find_resumable(root: str | os.PathLike[str], *, verify_checksums: bool = False) -> Resumable:
    """The newest intact checkpoint under ``root`` and the damaged ones newer than it.

    Read-only. A step directory counts as damaged when its manifest is missing or invalid,
    a listed file is missing, truncated, a link, or (with ``verify_checksums``) corrupted.

    Args:
        root: A checkpoint root (it may not exist yet: nothing to resume).
        verify_checksums: Also hash every file of the candidates (one read of each).

    Returns:
        A :class:`Resumable`: ``latest`` (or None) and ``damaged``, newest first.
    """
    root = Path(root)
    damaged: list[tuple[Path, list[str]]] = []
    if not root.is_dir():
        return Resumable(None, damaged)
    for step_dir in reversed(_step_dirs(root)):
        problems = inspect_step(step_dir, checksums=verify_checksums)[1]
        if not problems:
            return Resumable(step_dir, damaged)
        damaged.append((step_dir, problems))
    return Resumable(None, damaged)


def read_manifest(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """The manifest of a checkpoint (a step directory, or the newest under a root).

    Files are size-checked, not hashed; use :func:`verify_checkpoints` for checksums.

    Args:
        path: A step directory or a checkpoint root.

    Returns:
        The step directory and its parsed manifest.

    Raises:
        CheckpointError: If there is no such checkpoint or it is uncommitted or damaged.
    """
    step_dir = find_checkpoint(path)
    manifest, problems = inspect_step(step_dir, checksums=False)
    if manifest is None or problems:
        raise CheckpointError(f"invalid checkpoint {step_dir}: " + "; ".join(problems))
    return step_dir, manifest


def verify_checkpoints(path: str | os.PathLike[str]) -> dict[Path, list[str]]:
    """Checks sizes and checksums against the manifest, for one step or every step.

    Args:
        path: A step directory (checks it) or a checkpoint root (checks every
            ``step-XXXXXXXX`` directory in it, committed or not).

    Returns:
        Step directory → its problems (empty when intact), by ascending step.

    Raises:
        CheckpointError: If ``path`` is not a directory or a root holds no step directory.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    steps = [path] if _is_step_dir(path) else _step_dirs(path)
    if not steps:
        raise CheckpointError(f"{path}: no checkpoint (no step-XXXXXXXX directory)")
    return {step_dir: inspect_step(step_dir, checksums=True)[1] for step_dir in steps}


# ----------------------------------------------------------------------------------------------
# consolidation


def _safetensors_dict(model_state: Mapping[str, Any], step_dir: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    storages: set[tuple[int, int]] = set()
    for key, value in model_state.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(
                f"{step_dir}: model state {key!r} is a {type(value).__name__}; safetensors "
                "holds tensors only (write a .pt file instead)"
            )
        tensor = value.detach().cpu().contiguous()
        where = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        if where in storages:  # safetensors refuses shared memory (tied weights): copy
            tensor = tensor.clone()
        storages.add((tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()))
        tensors[key] = tensor
    return tensors


def _check_not_inside(out: Path, step_dir: Path) -> None:
    """Refuses an output inside the step directory read, or any step directory beside it."""
    target = out.resolve()
    source = step_dir.resolve()
    inside = [source, *(p.resolve() for p in _step_dirs(source.parent))]
    for directory in inside:
        if target.is_relative_to(directory):
            raise CheckpointError(
                f"{out} is inside the checkpoint {directory}: writing it there would damage "
                "the checkpoint; write the output outside the step directories"
            )


def _check_output(out: Path, overwrite: bool, include_optimizer: bool) -> None:
    if out.suffix not in CONSOLIDATED_SUFFIXES:
        raise ValueError(
            f"{out}: unknown output type {out.suffix or '(none)'!r}; expected one of "
            + ", ".join(CONSOLIDATED_SUFFIXES)
        )
    if include_optimizer and out.suffix == ".safetensors":
        raise ValueError(f"{out}: safetensors holds model weights only; write a .pt file")
    if out.is_dir():
        raise CheckpointError(f"{out} is a directory")
    if out.exists() and not overwrite:
        raise CheckpointError(f"{out} exists; pass overwrite=True (--force) to replace it")
    parent = out.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot write {out}: {parent} is not a writable directory")


def consolidate(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    include_optimizer: bool = False,
    overwrite: bool = False,
    trusted: bool = False,
) -> Path:
    """Turns a checkpoint (sharded or plain) into one file that loads into an unwrapped model.

    Runs in one process, without a process group, and needs the whole model in CPU memory.
    The checkpoint is verified against its manifest (sizes and checksums) first. Keys carry no
    wrapper prefixes, so ``model.load_state_dict(...)`` works on the plain model:

    - ``.safetensors``: the model weights (``safetensors.torch.load_file``), metadata
      ``{"format": "pt", "step": ...}``. Needs the ``safetensors`` package.
    - ``.pt`` / ``.pth``: ``torch.save`` of the model state dict, loadable with
      ``torch.load(weights_only=True)``; with ``include_optimizer`` a dict ``{"model_state",
      "optimizer_state", "extra"}`` instead. A sharded checkpoint's optimizer state is keyed
      by parameter name (load it with ``set_optimizer_state_dict(..., options=
      StateDictOptions(full_state_dict=True))``), a plain one's by index as usual.

    The file is written atomically (temporary file, fsync, rename), never inside the
    checkpoint it reads. Nothing in the checkpoint is unpickled beyond ``weights_only`` and
    the allow-lists of :mod:`~gpu_training.checkpoint.safe_load`, unless ``trusted``.

    Args:
        source: A step directory, or a checkpoint root (its newest committed checkpoint).
        out: The file to write; its suffix picks the format.
        include_optimizer: Also write the optimizer and extra state (``.pt`` only).
        overwrite: Replace ``out`` if it exists.
        trusted: Let a DeepSpeed checkpoint's reader unpickle without the allow-list
            (``--trust-checkpoint``); only for checkpoints from a source you trust.

    Returns:
        ``out`` as a ``Path``.

    Raises:
        CheckpointError: If the checkpoint is missing, damaged, holds objects outside the
            allow-lists or no model state, or ``out`` exists (without ``overwrite``), lies
            inside a step directory or cannot be written. Nothing is written.
        ValueError: If the suffix of ``out`` is not one of :data:`CONSOLIDATED_SUFFIXES`, or
            ``include_optimizer`` is asked of a ``.safetensors`` file.
        ImportError: If ``.safetensors`` is asked for and the package is missing.
    """
    out = Path(out)
    _check_output(out, overwrite, include_optimizer)
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file  # fail before the long load when missing
    step_dir, manifest = read_manifest(source)
    _check_not_inside(out, step_dir)
    problems = inspect_step(step_dir, checksums=True)[1]
    if problems:
        raise CheckpointError(f"refusing to consolidate {step_dir}: " + "; ".join(problems))
    state = format_of(manifest).full_state(step_dir, manifest, trusted=trusted)
    tmp = out.with_name(f".{out.name}.tmp-{secrets.token_hex(4)}")
    try:
        if out.suffix == ".safetensors":
            tensors = _safetensors_dict(state["model_state"], step_dir)
            save_file(tensors, str(tmp), metadata={"format": "pt", "step": str(manifest["step"])})
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        else:
            payload = state if include_optimizer else state["model_state"]
            with open(tmp, "wb") as f:
                torch.save(payload, cast(IO[bytes], f))
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
