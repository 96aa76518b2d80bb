"""Checkpoint directories that every rank writes into: committed as one, verified by all.

The protocol shared by sharded (FSDP2/DCP, :mod:`~gpu_training.checkpoint.sharded`) and
DeepSpeed (:mod:`~gpu_training.checkpoint.zero`) checkpoints; each supplies only a function
that writes its files. Saving (:func:`save_directory`): rank 0 makes one locked temporary
directory and shares its name; every rank writes its files there; each rank checksums the
files it wrote; rank 0 cross-checks them, writes ``manifest.json`` last, fsyncs, renames the
directory into place and prunes. Loading (:func:`choose_verified`): rank 0 finds the
candidates, every rank checksums a share of the files, and all ranks agree on one.

Every phase runs under :class:`_Attempt` and ends in :func:`_settle`, an all-gather of each
rank's outcome: an error on any rank reaches every rank as :class:`CheckpointError` before
anyone enters the next collective, the temporary directory is removed and nothing is pruned.
The directory must be on a file system every rank sees (one node, or NFS/Lustre...).

It is a module of its own because none of this depends on the format written: DCP and
DeepSpeed differ only in ``write``.

Example:
    >>> import tempfile
    >>> from gpu_training.checkpoint import CheckpointManager
    >>> from gpu_training.ddp import DistributedContext
    >>> manager = CheckpointManager(tempfile.mkdtemp(), ctx=DistributedContext())
    >>> def write(tmp: Path) -> set[str]:  # this rank's files, flat in tmp
    ...     _ = (tmp / "weights.bin").write_bytes(bytes(8))
    ...     return {"weights.bin"}
    >>> save_directory(manager, 7, write, "demo", extra={"step": 7}).name
    'step-00000007'
    >>> path = choose_verified(manager, None, "demo")  # each rank checksums a share
    >>> sorted(p.name for p in path.iterdir())
    ['extra.pt', 'manifest.json', 'weights.bin']
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
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

from gpu_training.checkpoint.files import (
    DEEPSPEED_FORMAT,
    EXTRA_NAME,
    MANIFEST_NAME,
    SHARDED_FORMAT,
    CheckpointError,
    _check_step,
    _entry_problem,
    _file_checksum,
    _fsync_dir,
    _inspect,
    _make_locked_tmp,
    _step_name,
    build_manifest,
)
from gpu_training.checkpoint.offline import state_format
from gpu_training.ddp import DistributedContext, process_group_up

if TYPE_CHECKING:
    from gpu_training.checkpoint.manager import CheckpointManager

__all__ = ["choose_verified", "save_directory"]

# DCP names rank r's files "__r_<n>.distcp"; DeepSpeed "[bf16_]zero_pp_rank_r_mp_rank_00_*.pt"
_RANK_FILE_RE = re.compile(r"__(\d+)_|zero_pp_rank_(\d+)_")
_CAUGHT = (Exception, CheckpointException)  # CheckpointException is a BaseException


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
        self.exc: BaseException | None = None
        """What was raised, kept for a traceback when it is re-raised on this rank alone."""
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
        self.exc = exc
        if not isinstance(exc, _CAUGHT):  # KeyboardInterrupt: re-raised after the exchange
            self.interrupt = exc
        return True


def _distributed(ctx: DistributedContext) -> bool:
    if not ctx.is_distributed:
        return False
    if not process_group_up():
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


# ----------------------------------------------------------------------------------------------
# saving


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
    manifest = build_manifest(
        step,
        manager.ctx.world_size,
        entries,
        state_format=fmt,
        config_hash=manager.config_hash,
        config=manager.config,
    )
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
        with _Attempt() as writing:
            written = write(shared_tmp)
        if writing.error is not None and _distributed(ctx):
            # The peers may be inside the writer's own collectives (DeepSpeed's barrier): an
            # exchange now would never complete. This rank fails at once; once it is gone
            # their collective fails too, and torchrun names this rank (no barrier, no wait).
            if writing.interrupt is not None:
                raise writing.interrupt
            raise CheckpointError(f"{what}: rank {ctx.rank}: {writing.error}") from writing.exc
        with _Attempt() as attempt:
            if writing.error is not None:  # one process: reported through the exchange below
                raise CheckpointError(writing.error)
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
        for entry in manifest["files"][ctx.rank :: ctx.world_size]:
            problem = _entry_problem(path, entry, checksums=True)
            if problem is not None:
                problems.append(problem)
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
    damaged: list[str] = []
    for _, path in reversed(manager._step_dirs()):
        manifest, problems = _inspect(path, checksums=False)
        if manifest is not None and not problems and state_format(manifest) == fmt:
            found_dirs.append((path, manifest))
        elif problems:
            damaged.append(f"{path.name}: {problems[0]}")
    if not found_dirs:
        why = f" (damaged: {'; '.join(damaged)})" if damaged else ""
        raise CheckpointError(f"no committed {_kind(fmt)} checkpoint in {manager.directory}{why}")
    return found_dirs


def choose_verified(
    manager: CheckpointManager, path_or_step: str | os.PathLike[str] | int | None, fmt: str
) -> Path:
    """The checkpoint of format ``fmt`` to load, its checksums verified; every rank.

    Each rank checksums a share of the files. With no ``path_or_step`` the newest one that
    verifies is taken, with a warning about newer ones that do not.

    Args:
        manager: The checkpoint directory and this rank's identity.
        path_or_step: A checkpoint directory, a step number, or None for the newest.
        fmt: The ``state_format`` the checkpoint must have.

    Returns:
        The step directory to load, the same on every rank.

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
