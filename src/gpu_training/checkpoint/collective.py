"""Checkpoint directories that every rank writes into: committed as one, verified by all.

The protocol shared by sharded (FSDP2/DCP, :mod:`~gpu_training.checkpoint.sharded`) and
DeepSpeed (:mod:`~gpu_training.checkpoint.zero`) checkpoints; each supplies only a function
that writes its files. Saving (:func:`save_directory`): rank 0 makes one locked temporary
directory and shares its name; every rank writes its files there; each rank checksums and
fsyncs the files it wrote; rank 0 cross-checks them, writes ``manifest.json`` last, fsyncs,
renames the directory into place and prunes. Loading (:func:`choose_verified`): rank 0 finds the
candidates, every rank checksums a share of the files, and all ranks agree on one.

Every phase runs under :class:`~gpu_training.checkpoint.attempt.Attempt` and ends in
:func:`~gpu_training.checkpoint.attempt.settle`, an all-gather of each rank's outcome: an
error on any rank reaches every rank as :class:`CheckpointError` before anyone enters the next
collective, the temporary directory is removed and nothing is pruned. The directory must be
on a file system every rank sees (one node, or NFS/Lustre...). Staging, committing and pruning
are the :class:`~gpu_training.checkpoint.directory.CheckpointDirectory`'s, on rank 0.

It is a module of its own because none of this depends on the format written: DCP and
DeepSpeed differ only in ``write``.

Example:
    >>> import tempfile
    >>> from gpu_training.checkpoint.directory import CheckpointDirectory
    >>> from gpu_training.checkpoint.formats import SHARDED
    >>> from gpu_training.ddp import DistributedContext
    >>> store, ctx = CheckpointDirectory(tempfile.mkdtemp()), DistributedContext()
    >>> def write(tmp: Path) -> set[str]:  # this rank's files, flat in tmp
    ...     _ = (tmp / "weights.bin").write_bytes(bytes(8))
    ...     return {"weights.bin"}
    >>> save_directory(store, ctx, 7, write, SHARDED, extra={"step": 7}).name
    'step-00000007'
    >>> path = choose_verified(store, ctx, None, SHARDED)  # each rank checksums a share
    >>> sorted(p.name for p in path.iterdir())
    ['extra.pt', 'manifest.json', 'weights.bin']
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, cast

import torch
import torch.distributed as dist

from gpu_training.checkpoint.attempt import Attempt, settle, uses_process_group
from gpu_training.checkpoint.directory import CheckpointDirectory, PathOrStep
from gpu_training.checkpoint.files import (
    EXTRA_NAME,
    CheckpointError,
    check_step,
    entry_problem,
    file_checksum,
    fsync_file,
    read_ahead,
)
from gpu_training.checkpoint.formats import CheckpointFormat, format_of
from gpu_training.checkpoint.offline import inspect_step
from gpu_training.checkpoint.safe_load import check_loads_back
from gpu_training.checkpoint.zip_crc import without_zip_crc32
from gpu_training.ddp import DistributedContext

__all__ = ["check_plain", "choose_verified", "save_directory"]

# DCP names rank r's files "__r_<n>.distcp"; DeepSpeed "[bf16_]zero_pp_rank_r_mp_rank_00_*.pt"
_RANK_FILE_RE = re.compile(r"__(\d+)_|zero_pp_rank_(\d+)_")
_READ_AHEAD_MIN_BYTES = 64 << 20  # below this, the hashing rank reads it about as fast alone


# ----------------------------------------------------------------------------------------------
# saving


def check_plain(values: Any, what: str) -> None:
    """Refuses values that ``torch.load(weights_only=True)`` could not read back.

    Args:
        values: What will be saved.
        what: What holds them, to start the refusal (``"extra"``...).

    Raises:
        CheckpointError: The values hold objects outside ``weights_only``'s allow-list.
    """
    buffer = io.BytesIO()
    torch.save(values, buffer)
    buffer.seek(0)
    check_loads_back(lambda: torch.load(buffer, weights_only=True), what)


def _write_extra(tmp: Path, extra: Mapping[str, Any]) -> None:
    """Writes ``extra.pt`` durably after checking that it loads with ``weights_only=True``."""
    check_plain(dict(extra), "extra")
    with open(tmp / EXTRA_NAME, "wb") as f, without_zip_crc32():
        torch.save(dict(extra), cast(IO[bytes], f))
        f.flush()
        os.fsync(f.fileno())


def _writer(name: str, world_size: int) -> int:
    """The rank that wrote (and checksums) file ``name``: its rank number, else rank 0."""
    match = _RANK_FILE_RE.search(name)
    return int(match.group(1) or match.group(2)) % world_size if match else 0


def _own_files(tmp: Path, ctx: DistributedContext) -> list[dict[str, Any]]:
    """Size and checksum of the files this rank answers for (its own shards; rank 0: the rest).

    Each is also made durable here: a writer may not fsync (DeepSpeed's ``torch.save`` does
    not; DCP is asked not to), so the write-back runs on a thread while the bytes are hashed.
    """
    with os.scandir(tmp) as found:
        names = sorted(e.name for e in found if e.is_file(follow_symlinks=False))
    mine = [tmp / name for name in names if _writer(name, ctx.world_size) == ctx.rank]
    with ThreadPoolExecutor(1, thread_name_prefix="checkpoint-fsync") as pool:
        # fsync waits on the disk, the checksum on the CPU: overlapped, not one after the other
        synced = [pool.submit(fsync_file, file) for file in mine]
        # hashed by the rank that wrote it, while it is still in that node's page cache
        entries = [
            {"name": file.name, "size": file.stat().st_size, "checksum": file_checksum(file)}
            for file in mine
        ]
        for job in synced:
            job.result()  # durable before the manifest can name it
    return entries


def _commit_shared(
    store: CheckpointDirectory,
    ctx: DistributedContext,
    tmp: Path,
    step: int,
    entries: list[dict[str, Any]],
    written: set[str],
    fmt: CheckpointFormat,
) -> Path:
    """Rank 0: cross-checks the ranks' files, writes the manifest last, commits durably."""
    listed = {str(e["name"]) for e in entries}
    with os.scandir(tmp) as found:
        present = {e.name for e in found}
    if present != listed:
        raise CheckpointError(
            f"the files in {tmp} seen by rank 0 ({sorted(present - listed)} unaccounted for, "
            f"{sorted(listed - present)} missing) differ from what the ranks wrote: is "
            f"{store.root} on a file system every rank shares?"
        )
    if not written <= listed:
        raise CheckpointError(f"the writer names files not in {tmp}: {written - listed}")
    for entry in entries:
        size = (tmp / str(entry["name"])).stat().st_size
        if size != entry["size"]:
            raise CheckpointError(f"{tmp / entry['name']}: {size} bytes, expected {entry['size']}")
    # the manifest is written last: without it the directory is not a checkpoint
    store.write_manifest(tmp, step, world_size=ctx.world_size, files=entries, state_format=fmt.name)
    final = store.commit(tmp, step)
    store.sync()
    return final


def save_directory(
    store: CheckpointDirectory,
    ctx: DistributedContext,
    step: int,
    write: Callable[[Path], set[str]],
    fmt: CheckpointFormat,
    *,
    extra: Mapping[str, Any] | None = None,
    prepare: Callable[[], None] | None = None,
) -> Path | None:
    """The commit protocol of a checkpoint that every rank writes files into; every rank.

    Rank 0 makes a locked staging directory and shares its name; ``prepare()`` runs on
    every rank (and rank 0 writes ``extra``) — an error there reaches every rank before any
    collective in ``write``; ``write(tmp)`` writes this rank's files into ``tmp`` (flat) and
    returns the names it knows were written (checked to exist); each rank checksums and
    fsyncs its own files; rank 0 writes the manifest (``"state_format": fmt.name``) last,
    commits, prunes.

    Args:
        store: The checkpoint root (rank 0 stages, commits and prunes in it).
        ctx: This rank's identity.
        step: The step number (>= 0).
        write: Writes the state into the directory it is given; called on every rank.
        fmt: The format written (the manifest's ``state_format`` is its name).
        extra: Plain state saved by rank 0 in ``extra.pt`` (``weights_only``-loadable).
        prepare: Work that may fail per rank before ``write``'s collectives start.

    Returns:
        The checkpoint directory on rank 0, None on the other ranks.

    Raises:
        CheckpointError: On every rank if any rank failed; the staging directory is
            removed and nothing is pruned.
        ValueError: If ``step`` is not an integer >= 0.
        TypeError: If ``extra`` is not a mapping.
    """
    check_step(step)
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"extra must be a mapping (a dict), got {type(extra).__name__}")
    uses_process_group(ctx)
    what = f"could not save step {step} to {store.root}"
    tmp: Path | None = None
    committed = False
    final: Path | None = None

    def exchange(attempt: Attempt, payload: Any = None) -> list[Any]:
        try:
            return settle(ctx, attempt, what, payload)
        except CheckpointError:
            # Rank 0 removes its staging directory before *any* rank reports the failure:
            # a caller that looks right after the error must find nothing half-written.
            if tmp is not None and not committed:
                shutil.rmtree(tmp, ignore_errors=True)
            if uses_process_group(ctx):
                dist.barrier()
            raise

    with contextlib.ExitStack() as stack:  # rank 0's staging: removed at exit unless committed
        with Attempt() as setup:
            if ctx.is_main_process:
                tmp = stack.enter_context(store.staging(step))
        name = exchange(setup, tmp.name if tmp is not None else None)[0]
        shared_tmp = store.root / str(name)

        with Attempt() as gather:
            if prepare is not None:
                prepare()
            if ctx.is_main_process and extra is not None:
                _write_extra(shared_tmp, extra)
        exchange(gather)  # before write: its collectives need every rank

        written: set[str] = set()
        entries: list[dict[str, Any]] = []
        with Attempt() as writing, without_zip_crc32():  # the manifest's checksums cover it
            written = write(shared_tmp)
        if writing.error is not None and uses_process_group(ctx):
            # The peers may be inside the writer's own collectives (DeepSpeed's barrier): an
            # exchange now would never complete. This rank fails at once; once it is gone
            # their collective fails too, and torchrun names this rank (no barrier, no wait).
            if writing.interrupt is not None:
                raise writing.interrupt
            raise CheckpointError(f"{what}: rank {ctx.rank}: {writing.error}") from writing.exc
        with Attempt() as attempt:
            if writing.error is not None:  # one process: reported through the exchange below
                raise CheckpointError(writing.error)
            entries = _own_files(shared_tmp, ctx)
        every = exchange(attempt, entries)

        with Attempt() as commit:
            if ctx.is_main_process:
                final = _commit_shared(
                    store, ctx, shared_tmp, step, [e for es in every for e in es], written, fmt
                )
                committed = True
                store.prune(keep=final)  # only after a commit; failures there only warn
        exchange(commit)
    return final


# ----------------------------------------------------------------------------------------------
# loading


def _checksum_share(entries: list[dict[str, Any]], ctx: DistributedContext) -> list[Any]:
    """The manifest entries this rank checksums on load.

    Rank r takes ``__r_*`` / ``zero_pp_rank_r_*``: at the same world size, the files it loads
    next, so they are read into its own node's page cache. The others go round-robin, the
    largest first, from the last rank (rank 0 also lists the candidates).
    """
    ranked = [e for e in entries if _RANK_FILE_RE.search(str(e["name"]))]
    others = [e for e in entries if not _RANK_FILE_RE.search(str(e["name"]))]
    others.sort(key=lambda e: -int(e["size"]))
    mine = [e for e in ranked if _writer(str(e["name"]), ctx.world_size) == ctx.rank]
    return mine + others[ctx.world_size - 1 - ctx.rank :: ctx.world_size]


def _read_ahead_share(
    entries: list[dict[str, Any]], ctx: DistributedContext
) -> list[tuple[str, int, int]]:
    """(name, offset, length) this rank asks the page cache to read for another rank's share.

    A large file that no rank wrote (DeepSpeed's model states: a third more than a rank's
    own file) is checksummed by one rank after its own: the others, idle by then, have the
    kernel read a slice each beforehand. One node only: another node's page cache is not
    the hashing rank's.
    """
    if ctx.world_size == 1 or ctx.local_world_size != ctx.world_size:
        return []
    others = [e for e in entries if not _RANK_FILE_RE.search(str(e["name"]))]
    hashed_here = {str(e["name"]) for e in _checksum_share(entries, ctx)}
    out = []
    for entry in others:
        size = int(entry["size"])
        if size < _READ_AHEAD_MIN_BYTES or str(entry["name"]) in hashed_here:
            continue
        part = -(-size // ctx.world_size)
        out.append((str(entry["name"]), ctx.rank * part, part))
    return out


def _verify_shared(ctx: DistributedContext, path: Path, manifest: dict[str, Any]) -> list[str]:
    """Checksums ``path``'s files, each rank a share of them; every rank gets all problems."""
    problems: list[str] = []
    with Attempt() as check:
        for name, start, length in _read_ahead_share(manifest["files"], ctx):
            read_ahead(path / name, start, length)
        for entry in _checksum_share(manifest["files"], ctx):
            problem = entry_problem(path, entry, checksums=True)
            if problem is not None:
                problems.append(problem)
    every = settle(ctx, check, f"could not verify {path}", problems)
    return [p for rank_problems in every for p in rank_problems]


def _candidates(
    store: CheckpointDirectory, path_or_step: PathOrStep | None, fmt: CheckpointFormat
) -> list[tuple[Path, dict[str, Any]]]:
    """Rank 0's view: (step dir, manifest) to try, newest first; raises if there are none."""
    if path_or_step is not None:
        path = store.resolve(path_or_step)
        manifest, problems = inspect_step(path, checksums=False)
        if manifest is None or problems:
            raise CheckpointError(f"refusing to load {path}: " + "; ".join(problems))
        found = format_of(manifest)
        if found is not fmt:
            raise CheckpointError(
                f"{path} is a {found.title} checkpoint, not {fmt.title}: load it with "
                f"{found.loader}, not {fmt.loader}"
            )
        return [(path, manifest)]
    found_dirs = []
    damaged: list[str] = []
    for _, path in reversed(store.step_dirs()):
        manifest, problems = inspect_step(path, checksums=False)
        if manifest is not None and not problems and format_of(manifest) is fmt:
            found_dirs.append((path, manifest))
        elif problems:
            damaged.append(f"{path.name}: {problems[0]}")
    if not found_dirs:
        why = f" (damaged: {'; '.join(damaged)})" if damaged else ""
        raise CheckpointError(f"no committed {fmt.title} checkpoint in {store.root}{why}")
    return found_dirs


def choose_verified(
    store: CheckpointDirectory,
    ctx: DistributedContext,
    path_or_step: PathOrStep | None,
    fmt: CheckpointFormat,
) -> Path:
    """The checkpoint of format ``fmt`` to load, its checksums verified; every rank.

    Each rank checksums a share of the files. With no ``path_or_step`` the newest one that
    verifies is taken, with a warning about newer ones that do not.

    Args:
        store: The checkpoint root.
        ctx: This rank's identity.
        path_or_step: A checkpoint directory, a step number, or None for the newest.
        fmt: The format the checkpoint must have.

    Returns:
        The step directory to load, the same on every rank.

    Raises:
        CheckpointError: On every rank, if there is none, or the one asked for is damaged
            or of another format.
    """
    what = f"could not load a {fmt.title} checkpoint from {store.root}"
    candidates: list[tuple[Path, dict[str, Any]]] = []
    with Attempt() as find:
        if ctx.is_main_process:
            candidates = _candidates(store, path_or_step, fmt)
    candidates = settle(ctx, find, what, candidates)[0]
    manifests = dict(candidates)

    def problems_of(path: Path) -> list[str]:
        problems = _verify_shared(ctx, path, manifests[path])
        if problems and path_or_step is not None:
            raise CheckpointError(f"refusing to load {path}: " + "; ".join(problems))
        return problems

    return store.newest_verified(
        [path for path, _ in candidates],
        problems_of,
        nothing=f"no valid {fmt.name!r} checkpoint in {store.root}",
        warn=ctx.is_main_process,  # the same warning once, from rank 0
        stacklevel=4,
    )
