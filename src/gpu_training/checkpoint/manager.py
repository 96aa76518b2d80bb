"""Checkpoints that are never half-written: rank-0 writes, atomic commit, verified loads.

A checkpoint is a directory ``DIR/step-00001234/`` holding ``state.pt`` (one ``torch.save``)
and ``manifest.json``, written last: format version, step, world size, config hash, UTC
creation time, and each file's size and checksum (XXH3, or CRC32 without ``xxhash``). A
directory without a valid manifest does not exist for :meth:`CheckpointManager.latest`. A save goes to ``DIR/.tmp-step-00001234-<random>/``,
every file is fsynced, then the directory is renamed into place, so a crash (SIGKILL, power
loss, full disk) at any moment leaves the previous checkpoints intact and at worst a ``.tmp-*``
directory that :meth:`CheckpointManager.clean_stale` removes. The parent directory is fsynced
(making the rename itself durable) before any older checkpoint is pruned, and by ``wait()``,
``close()`` and at exit; until then a power loss can only make the newest checkpoint not exist,
never half-exist.

Loading uses ``torch.load(..., weights_only=True)`` after checking sizes and checksums against
the manifest, so nothing in a checkpoint is unpickled as an arbitrary object.

Example:
    >>> import torch, tempfile
    >>> from gpu_training.ddp import DistributedContext
    >>> model = torch.nn.Linear(2, 1)
    >>> ckpt = CheckpointManager(tempfile.mkdtemp(), ctx=DistributedContext(), keep_last_n=2)
    >>> path = ckpt.save({"model_state": model.state_dict(), "epoch": 0}, step=10)
    >>> path.name
    'step-00000010'
    >>> state = ckpt.load()  # the newest checkpoint that verifies
    >>> sorted(state)
    ['epoch', 'model_state']
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import json
import os
import pickle  # only for pickle.UnpicklingError: nothing here unpickles with pickle
import secrets
import shutil
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, cast

import torch
import torch.distributed as dist

from gpu_training.checkpoint.files import (
    _STEP_RE,
    _TMP_PREFIX,
    MANIFEST_NAME,
    STATE_NAME,
    CheckpointError,
    _check_step,
    _exchange,
    _fsync_dir,
    _HashingWriter,
    _inspect,
    _make_locked_tmp,
    _step_name,
    _try_lock,
    build_manifest,
)
from gpu_training.checkpoint.keys import strip_wrapper_prefixes
from gpu_training.checkpoint.offline import Resumable, find_resumable
from gpu_training.checkpoint.safe_load import refused_message
from gpu_training.checkpoint.snapshot import _Buffers, _Snapshot, snapshot_state
from gpu_training.ddp import DistributedContext, process_group_up

try:  # POSIX only: without it a writer's temporary directory is not protected by a lock
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["CheckpointManager"]


MapLocation = str | torch.device | dict[str, str] | Callable[..., Any] | None

_STATUS_BYTES = 4096  # rank 0's error message travels to the other ranks in this many bytes


def _status_device() -> torch.device:
    # NCCL only moves CUDA tensors; gloo (alone or in "cpu:gloo,cuda:nccl") moves CPU ones
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass(eq=False)
class _SaveOutcome:
    """What rank 0's write of one checkpoint came to; an async save's writer fills it in."""

    step: int
    path: Path | None = None
    failure: CheckpointError | None = None
    interrupt: BaseException | None = None
    thread: threading.Thread | None = None


_WITH_PENDING_SAVES: weakref.WeakSet[CheckpointManager] = weakref.WeakSet()


def _settle_all_at_exit() -> None:
    for manager in list(_WITH_PENDING_SAVES):
        manager._settle_locally()


@functools.cache
def _install_exit_hook() -> None:
    # threading's exit hooks run before concurrent.futures stops taking work, which the writer
    # needs; plain atexit hooks run after that, too late to let a pending save finish
    register = getattr(threading, "_register_atexit", atexit.register)
    register(_settle_all_at_exit)


# ----------------------------------------------------------------------------------------------
# the manager


class CheckpointManager:
    """Saves, prunes, finds and loads checkpoints in one directory; only rank 0 writes.

    Every rank calls :meth:`save`; rank 0 writes and the others wait for it, and if rank 0's
    write fails every rank raises :class:`CheckpointError` instead of hanging. Saving to a step
    that already exists replaces it atomically: the new checkpoint is written under a temporary
    name and swapped in (``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere two renames, where a
    crash in between loses that one step and keeps the older ones).

    ``save(..., async_save=True)`` returns once rank 0 has copied the state to CPU memory and
    writes it in a background thread, by the same atomic path. Its outcome is exchanged between
    ranks at the next :meth:`save`, :meth:`wait` or :meth:`close` (every rank calls them): only
    then is the checkpoint known to be committed, and a failure is raised there, on every rank.
    Use the manager as a context manager (or call :meth:`close`) so that a pending save is
    waited for; at interpreter exit a pending save is still completed, and a failure printed.

    Args:
        directory: Where ``step-XXXXXXXX/`` directories live; created on the first save.
        ctx: This process's rank identity; ``DistributedContext.from_env()`` when None.
        keep_last_n: Committed checkpoints to keep (the newest by step); None keeps all.
        config_hash: Recorded in each manifest, e.g. a hash of the training config.
        config: The settings themselves (plain data, e.g. ``JobConfig.to_dict()``), recorded
            in each manifest as ``"config"`` so a resume can name the fields that changed.
        trust_checkpoint: Let DeepSpeed's readers unpickle checkpoint files without the
            ``weights_only`` allow-list (:mod:`~gpu_training.checkpoint.safe_load`); only for
            checkpoints from a source you trust. Plain and sharded loads never need it.

    Raises:
        ValueError: If ``keep_last_n`` is not None or an integer >= 1.

    Example:
        >>> from gpu_training.ddp import unwrap_model
        >>> ckpt = CheckpointManager("checkpoints", ctx=ctx, keep_last_n=3)  # doctest: +SKIP
        >>> ckpt.save(state={"model_state": unwrap_model(model).state_dict(),
        ...                  "optimizer_state": optimizer.state_dict(),
        ...                  "epoch": epoch},
        ...           step=global_step)  # doctest: +SKIP
        >>> state = ckpt.load()  # on resume, every rank  # doctest: +SKIP
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        ctx: DistributedContext | None = None,
        keep_last_n: int | None = 3,
        config_hash: str | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        trust_checkpoint: bool = False,
    ) -> None:
        if keep_last_n is not None and (
            isinstance(keep_last_n, bool) or not isinstance(keep_last_n, int) or keep_last_n < 1
        ):
            raise ValueError(
                f"keep_last_n must be an integer >= 1 (or None to keep every checkpoint), "
                f"got {keep_last_n!r}"
            )
        self.directory = Path(directory)
        self.ctx = ctx if ctx is not None else DistributedContext.from_env()
        self.keep_last_n = keep_last_n
        self.config_hash = config_hash
        self.config = dict(config) if config is not None else None
        self.trust_checkpoint = trust_checkpoint
        self._pending: _SaveOutcome | None = None
        self._unsynced_commit = False  # rank 0: a rename not yet made durable (_sync_directory)
        self._staging: _Buffers = {}  # host buffers of the last async snapshot, for the next
        if self.ctx.is_main_process:
            self.clean_stale()

    # -- reading -------------------------------------------------------------------------------

    def _step_dirs(self) -> list[tuple[int, Path]]:
        """Every ``step-XXXXXXXX`` directory, committed or not, by ascending step."""
        if not self.directory.is_dir():
            return []
        found = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                match = _STEP_RE.fullmatch(entry.name)
                if (
                    match
                    and entry.name == _step_name(int(match.group(1)))
                    and entry.is_dir(follow_symlinks=False)
                ):
                    found.append((int(match.group(1)), Path(entry.path)))
        return sorted(found)

    def _resolve(self, path_or_step: str | os.PathLike[str] | int) -> Path:
        if isinstance(path_or_step, int):  # _check_step refuses True/False
            return self.directory / _step_name(_check_step(path_or_step))
        path = Path(path_or_step)
        if not path.is_absolute() and not path.exists() and (self.directory / path).exists():
            return self.directory / path  # "step-00000010" relative to the manager's directory
        return path

    def list_checkpoints(self) -> list[Path]:
        """Committed checkpoints (valid manifest, listed files present with the right sizes).

        Returns:
            Their directories by ascending step.
        """
        return [p for _, p in self._step_dirs() if not _inspect(p, checksums=False)[1]]

    def latest(self, *, verify_checksums: bool = False) -> Path | None:
        """The newest committed checkpoint; uncommitted or damaged directories are skipped.

        On rank 0 it first removes stale ``.tmp-*`` directories (:meth:`clean_stale`).

        Args:
            verify_checksums: Also read every file and compare its checksum with the manifest
                (catches silent corruption; costs one read of the checkpoint).

        Returns:
            The checkpoint directory, or None when there is none.
        """
        if self.ctx.is_main_process:
            self.clean_stale()
        for _, path in reversed(self._step_dirs()):
            if not _inspect(path, checksums=verify_checksums)[1]:
                return path
        return None

    def find_resumable(self, *, verify_checksums: bool = False) -> Resumable:
        """The newest committed checkpoint, and the damaged step directories newer than it.

        Read-only (unlike :meth:`latest`, stale ``.tmp-*`` directories are left alone): see
        :func:`~gpu_training.checkpoint.offline.find_resumable`. A run that resumed behind
        damaged checkpoints would overwrite them when it reaches their steps; the Trainer
        refuses with :meth:`Resumable.refusal` instead.

        Args:
            verify_checksums: Also hash the files (one read of each candidate).

        Returns:
            ``Resumable(latest, damaged)``.
        """
        return find_resumable(self.directory, verify_checksums=verify_checksums)

    def verify(self, path_or_step: str | os.PathLike[str] | int) -> list[str]:
        """Checks a checkpoint against its manifest: presence, sizes and checksums.

        Args:
            path_or_step: A checkpoint directory or a step number.

        Returns:
            One message per problem; empty when the checkpoint is intact.
        """
        return _inspect(self._resolve(path_or_step), checksums=True)[1]

    def manifest(self, path_or_step: str | os.PathLike[str] | int) -> dict[str, Any]:
        """The parsed manifest of a checkpoint (its files are size-checked, not hashed).

        Args:
            path_or_step: A checkpoint directory or a step number.

        Returns:
            The manifest: ``step``, ``world_size``, ``config_hash``, ``created``, ``files``...

        Raises:
            CheckpointError: If the checkpoint is missing, uncommitted or damaged.
        """
        path = self._resolve(path_or_step)
        manifest, problems = _inspect(path, checksums=False)
        if manifest is None or problems:
            raise CheckpointError(f"invalid checkpoint {path}: " + "; ".join(problems))
        return manifest

    def load(
        self,
        path_or_step: str | os.PathLike[str] | int | None = None,
        map_location: MapLocation = "cpu",
    ) -> dict[str, Any]:
        """Loads a checkpoint after verifying it, with ``torch.load(weights_only=True)``.

        With no argument it loads the newest checkpoint that verifies, warning about newer
        ones that do not. To know which step that is, call ``latest(verify_checksums=True)``
        and pass its result.

        Args:
            path_or_step: A checkpoint directory, a step number, or None for the newest.
            map_location: Passed to ``torch.load`` (default: everything on the CPU).

        Returns:
            The saved state dict.

        Raises:
            CheckpointError: If there is no checkpoint, the manifest is missing or invalid, a
                file is missing, truncated or fails its checksum, or the content is not a
                plain state (e.g. a pickle that would run code): the message names the file.
        """
        if path_or_step is not None:
            path = self._resolve(path_or_step)
            problems = _inspect(path, checksums=True)[1]
            if problems:
                raise CheckpointError(f"refusing to load {path}: " + "; ".join(problems))
            return self._load_verified(path, map_location)
        if self.ctx.is_main_process:
            self.clean_stale()
        skipped: list[str] = []
        for _, path in reversed(self._step_dirs()):
            problems = _inspect(path, checksums=True)[1]
            if problems:
                skipped += problems
                continue
            if skipped:
                warnings.warn(
                    f"loading {path}; skipped newer checkpoints that failed verification: "
                    + "; ".join(skipped),
                    stacklevel=2,
                )
            return self._load_verified(path, map_location)
        detail = (": " + "; ".join(skipped)) if skipped else ""
        raise CheckpointError(f"no valid checkpoint in {self.directory}{detail}")

    @staticmethod
    def _load_verified(path: Path, map_location: MapLocation) -> dict[str, Any]:
        file = path / STATE_NAME
        if not file.exists() and (path / ".metadata").exists():  # DCP's index file
            raise CheckpointError(
                f"{path} is a sharded (DCP) checkpoint: load it with load_sharded()"
            )
        try:
            state = torch.load(file, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            # one line, and not torch's advice to re-run with weights_only=False
            raise CheckpointError(refused_message(file, exc, hint=None) or str(exc)) from exc
        except Exception as exc:
            raise CheckpointError(f"could not load {file}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(state, dict):
            raise CheckpointError(f"{file} holds a {type(state).__name__}, expected a dict")
        return state

    # -- writing -------------------------------------------------------------------------------

    def clean_stale(self) -> list[Path]:
        """Removes ``.tmp-*`` directories left by interrupted saves or prunes.

        A directory whose writer is still alive (it holds a lock on it) is left alone.

        Returns:
            The directories removed.
        """
        removed: list[Path] = []
        if not self.directory.is_dir():
            return removed
        with os.scandir(self.directory) as entries:
            stale = [
                Path(e.path)
                for e in entries
                if e.name.startswith(_TMP_PREFIX) and e.is_dir(follow_symlinks=False)
            ]
        for path in stale:
            try:
                fd = _try_lock(path)
            except OSError:  # gone already, or not ours to open
                continue
            if fd is None:  # a live save holds it
                continue
            try:
                shutil.rmtree(path, ignore_errors=True)
            finally:
                os.close(fd)
            removed.append(path)
        return removed

    def save(
        self,
        state: Mapping[str, Any],
        step: int,
        *,
        metadata: Mapping[str, Any] | None = None,
        async_save: bool = False,
    ) -> Path | None:
        """Writes ``state`` as checkpoint ``step`` on rank 0; a barrier for every rank.

        Wrapper prefixes are stripped from the keys (:func:`strip_wrapper_prefixes`). After a
        successful commit the oldest committed checkpoints beyond ``keep_last_n`` are removed;
        after a failure nothing is. Before committing, rank 0 checks that the file loads with
        ``weights_only=True``, so a state that could never be resumed is refused at save time.

        A save first waits for a pending asynchronous one (:meth:`wait`), and raises its
        error if it failed; this save is then not started.

        With ``async_save=True`` rank 0 blocks only while it copies ``state`` to CPU memory
        (:func:`snapshot_state`; training may change the tensors as soon as the call returns)
        and a background thread writes, verifies, commits and prunes exactly as a synchronous
        save does. The other ranks return at once: no rank waits for the write until the
        next :meth:`save`, :meth:`wait` or :meth:`close`, where the outcome is shared and a
        failure is raised on every rank. Until then :meth:`latest` and :meth:`load` do not see
        the new checkpoint. The manager keeps the host copy's buffers and refills them at the
        next asynchronous save (fresh pages cost more than the copy): one state's worth of
        host memory (pinned when the state is on GPUs), until :meth:`close`.

        Args:
            state: What to save: tensors, numbers, strings and (nested) lists/dicts of them.
            step: The step number (>= 0); an existing checkpoint of that step is replaced.
            metadata: JSON-serialisable extras recorded in the manifest.
            async_save: Return after the copy and write in the background (see above).

        Returns:
            The checkpoint directory on rank 0 (for an asynchronous save, where it will be
            once committed), None on the other ranks.

        Raises:
            CheckpointError: On every rank if rank 0 could not write the checkpoint (full
                disk, permissions, a state ``weights_only`` cannot load...), or could not
                write a pending asynchronous one.
            ValueError: If ``step`` is not an integer >= 0.
            TypeError: If ``state`` is not a mapping.
        """
        _check_step(step)
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping (a dict), got {type(state).__name__}")
        self.wait()
        outcome = _SaveOutcome(step)
        if async_save:
            return self._start_async(state, metadata, outcome)
        if self.ctx.is_main_process:
            self._write_and_prune(state, metadata, outcome)
        return self._conclude(outcome)

    @property
    def pending(self) -> bool:
        """True from an asynchronous save until the :meth:`wait` (or save) that collects it.

        The same on every rank (the write itself may be over already), so it is safe to branch
        on before a call that every rank must make.
        """
        return self._pending is not None

    def wait(self) -> Path | None:
        """Waits for a pending asynchronous save and shares its outcome; every rank calls it.

        Returns:
            The committed checkpoint directory on rank 0; None on the other ranks, and when
            no save was pending.

        Raises:
            CheckpointError: On every rank if rank 0 could not write the pending checkpoint.
        """
        outcome = self._pending
        if outcome is None:
            self._sync_directory()
            return None
        if outcome.thread is not None:
            outcome.thread.join()
        self._pending = None  # before raising: the error is reported once, the next save runs
        self._sync_directory()
        return self._conclude(outcome)

    def close(self) -> None:
        """Waits for a pending asynchronous save (like :meth:`wait`, on every rank).

        Also frees the host buffers kept for the next asynchronous save. Safe to call more
        than once; the manager can still save afterwards.

        Raises:
            CheckpointError: On every rank if the pending save failed.
        """
        try:
            self.wait()
        finally:
            _WITH_PENDING_SAVES.discard(self)
            self._staging = {}

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:  # unwinding an error: the other ranks may never reach a collective
            self._settle_locally()

    def _settle_locally(self) -> None:
        """Joins the writer without a collective; a failure becomes a warning, not an error."""
        outcome, self._pending = self._pending, None
        _WITH_PENDING_SAVES.discard(self)
        if outcome is not None and outcome.thread is not None:
            outcome.thread.join()
        with contextlib.suppress(OSError):
            self._sync_directory()
        if outcome is None:
            return
        if outcome.failure is not None:
            warnings.warn(
                f"asynchronous checkpoint of step {outcome.step} was not saved: {outcome.failure}",
                RuntimeWarning,
                stacklevel=2,
            )

    def _start_async(
        self, state: Mapping[str, Any], metadata: Mapping[str, Any] | None, outcome: _SaveOutcome
    ) -> Path | None:
        """Snapshots ``state`` on rank 0 and starts the writer thread."""
        if not self.ctx.is_main_process:  # only rank 0 writes: nothing to copy here
            self._pending = outcome
            return None
        try:
            copier = _Snapshot(spares=self._staging)
            snapshot = copier.run(state)
            self._staging = copier.buffers  # free again once this save is written
            extras = None if metadata is None else snapshot_state(dict(metadata))
        except Exception as exc:  # reported like a failed write, on every rank, at wait()
            outcome.failure = self._save_error(outcome.step, exc)
        except BaseException:
            outcome.failure = CheckpointError(
                f"could not save step {outcome.step} to {self.directory}: interrupted"
            )
            self._pending = outcome  # the other ranks still learn it at the next wait()
            raise
        else:
            outcome.thread = threading.Thread(
                target=self._write_and_prune,
                args=(snapshot, extras, outcome),
                name=f"checkpoint-step-{outcome.step}",
            )
            _install_exit_hook()  # at interpreter exit: finish the write, print a failure
            _WITH_PENDING_SAVES.add(self)
            outcome.thread.start()
        self._pending = outcome
        return self.directory / _step_name(outcome.step)

    def _write_and_prune(
        self, state: Mapping[str, Any], metadata: Mapping[str, Any] | None, outcome: _SaveOutcome
    ) -> None:
        """Rank 0's part of a save; records the result in ``outcome`` instead of raising."""
        try:
            outcome.path = self._write(state, outcome.step, metadata)
            self._prune(keep=outcome.path)
        except CheckpointError as exc:
            outcome.failure = exc
        except Exception as exc:
            outcome.failure = self._save_error(outcome.step, exc)
        except BaseException as exc:  # KeyboardInterrupt: still release the other ranks
            outcome.interrupt = exc

    def _save_error(self, step: int, exc: Exception) -> CheckpointError:
        # torch reports a full disk as RuntimeError("unexpected pos ..."), not OSError
        code = getattr(exc, "errno", None)
        if "unexpected pos" in str(exc) or code in (errno.ENOSPC, errno.EDQUOT):
            hint = " (is the disk full?)"
        elif code == errno.EFBIG:
            hint = " (the file exceeds the file-size limit: see `ulimit -f`)"
        else:
            hint = ""
        failure = CheckpointError(
            f"could not save step {step} to {self.directory}: {type(exc).__name__}: {exc}{hint}"
        )
        failure.__cause__ = exc
        return failure

    def _conclude(self, outcome: _SaveOutcome) -> Path | None:
        """Shares rank 0's outcome with every rank and raises a failure everywhere."""
        interrupt, failure = outcome.interrupt, outcome.failure
        message = f"{type(interrupt).__name__} on rank 0" if interrupt else None
        remote = self._share_status(str(failure) if failure else message)
        if interrupt is not None:
            raise interrupt
        if failure is not None:
            raise failure
        if remote is not None:
            raise CheckpointError(
                f"rank 0 failed to save step {outcome.step} to {self.directory}: {remote}"
            )
        return outcome.path

    def _share_status(self, message: str | None) -> str | None:
        """Broadcasts rank 0's outcome; returns its error message (None on success).

        This collective is also the barrier: no rank returns from save() before rank 0 has
        finished writing, and a failure on rank 0 reaches the ranks instead of hanging them.
        """
        if not (self.ctx.is_distributed and process_group_up()):
            return message
        status = torch.zeros(_STATUS_BYTES, dtype=torch.uint8)
        if self.ctx.is_main_process and message is not None:
            raw = message.encode("utf-8", errors="replace")[: _STATUS_BYTES - 1]
            status[0] = 1
            status[1 : 1 + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        device_status = status.to(_status_device())
        dist.broadcast(device_status, src=0)
        status = device_status.cpu()
        if int(status[0]) == 0:
            return None
        return bytes(status[1:].tolist()).rstrip(b"\0").decode("utf-8", errors="replace")

    def _write(self, state: Mapping[str, Any], step: int, metadata: Any) -> Path:
        """Writes and commits one checkpoint; removes its temporary directory on any error."""
        extras = json.loads(json.dumps(dict(metadata or {})))  # fail before writing anything
        clean_state = strip_wrapper_prefixes(state)
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, exist_ok=True)
            _fsync_dir(self.directory.parent)
        final = self.directory / _step_name(step)
        tmp, lock_fd = _make_locked_tmp(self.directory, final.name)
        try:
            with (
                ThreadPoolExecutor(3, thread_name_prefix="checkpoint") as pool,
                open(tmp / STATE_NAME, "wb") as raw,
            ):
                sink = _HashingWriter(raw, pool)
                try:
                    torch.save(clean_state, cast(IO[bytes], sink))
                except Exception as exc:
                    if sink.error is not None and sink.error is not exc:
                        raise sink.error from exc  # the real cause, not "unexpected pos"
                    raise
                raw.flush()
                on_disk = os.fstat(raw.fileno()).st_size
                if on_disk != sink.size:
                    raise OSError(f"{tmp / STATE_NAME}: {on_disk} bytes on disk, {sink.size} sent")
                manifest = build_manifest(
                    step,
                    self.ctx.world_size,
                    [{"name": STATE_NAME, "size": sink.size, "checksum": sink.checksum.text()}],
                    config_hash=self.config_hash,
                    config=self.config,
                    metadata=extras,
                )
                # the manifest is written last, once the state is complete
                with open(tmp / MANIFEST_NAME, "wb") as man:
                    man.write(json.dumps(manifest, indent=2).encode())
                    man.flush()
                    # concurrent fsyncs share one journal commit: 40 ms instead of 51 ms in a row
                    jobs = [
                        pool.submit(os.fsync, raw.fileno()),
                        pool.submit(os.fsync, man.fileno()),
                        pool.submit(_fsync_dir, tmp),
                    ]
                    try:
                        self._check_loadable(tmp / STATE_NAME, final)
                    finally:
                        for job in jobs:  # wait before the files close, even on error
                            job.exception()
                    for job in jobs:
                        job.result()
            # everything in tmp is durable: one rename makes it a checkpoint. Making the rename
            # itself durable (a directory fsync: a second journal commit, ~15-25% of a 41 MB
            # save) is deferred until something depends on it: see _sync_directory.
            self._commit(tmp, final)
            self._unsynced_commit = True
            _WITH_PENDING_SAVES.add(self)  # so that exit makes it durable too
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            os.close(lock_fd)
        return final

    @staticmethod
    def _check_loadable(file: Path, final: Path) -> None:
        """Refuses to commit a state that ``load`` (weights_only) could never read back."""
        try:  # mmap: reads the pickle and maps the tensors without copying (~2 ms for 40 MB)
            loaded = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError as exc:
            reason = " ".join(str(exc).split())[:600]
            raise CheckpointError(
                f"not saving {final}: the state holds objects that torch.load(weights_only=True) "
                f"refuses, so it could never be loaded. Save tensors, numbers, strings and "
                f"lists/dicts of them (convert numpy arrays with torch.from_numpy), or allow a "
                f"type with torch.serialization.add_safe_globals. torch says: {reason}"
            ) from exc
        del loaded

    @staticmethod
    def _commit(tmp: Path, final: Path) -> None:
        if not os.path.lexists(final):
            os.replace(tmp, final)  # atomic: readers see no directory or the whole checkpoint
            return
        if _exchange(tmp, final):  # one atomic swap: there is always a committed step dir
            shutil.rmtree(tmp, ignore_errors=True)  # now holds the old checkpoint
            return
        old = final.with_name(f"{_TMP_PREFIX}old-{final.name}-{secrets.token_hex(4)}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)

    def _sync_directory(self) -> None:
        """Makes the last commit's rename durable (fsync of the checkpoint directory).

        Called before an older checkpoint is removed (a power loss must never leave fewer
        complete checkpoints than before), by :meth:`wait`, :meth:`close` and at exit. Until
        then a crash of the process loses nothing (the rename is done), and a power loss can
        only take the newest checkpoint back to not existing — never half-written.
        """
        if self._unsynced_commit:
            _fsync_dir(self.directory)
            self._unsynced_commit = False

    def _prune(self, keep: Path) -> None:
        """Removes committed checkpoints older than the newest ``keep_last_n`` (not ``keep``)."""
        if self.keep_last_n is None:
            return
        doomed_paths = [p for p in self.list_checkpoints()[: -self.keep_last_n] if p != keep]
        if doomed_paths:
            self._sync_directory()  # the new checkpoint is durable before an old one goes
        for path in doomed_paths:
            if path == keep:
                continue
            doomed = path.with_name(f"{_TMP_PREFIX}prune-{path.name}-{secrets.token_hex(4)}")
            try:
                os.replace(path, doomed)  # atomic: a crash mid-delete leaves a .tmp-* dir only
                shutil.rmtree(doomed)
            except OSError as exc:  # the checkpoint just written is fine; say so and go on
                warnings.warn(f"could not remove old checkpoint {path}: {exc}", stacklevel=3)

    # -- sharded (FSDP2) checkpoints: implemented in checkpoint/sharded.py ---------------------

    def save_sharded(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        step: int,
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> Path | None:
        """Saves a sharded (DCP) checkpoint; every rank. See :func:`.sharded.save_sharded`.

        Args:
            model: The model, sharded with ``fully_shard`` or not.
            optimizer: Its optimizer, or None to save the model only.
            step: The step number (>= 0).
            extra: Plain state to resume with (step, sampler, scheduler...); rank 0's copy.

        Returns:
            The checkpoint directory on rank 0, None on the other ranks.

        Raises:
            CheckpointError: On every rank if any rank failed; nothing is pruned.
        """
        from gpu_training.checkpoint.sharded import save_sharded

        return save_sharded(self, model, optimizer, step, extra=extra)

    def load_sharded(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        path_or_step: str | os.PathLike[str] | int | None = None,
    ) -> dict[str, Any]:
        """Loads a sharded checkpoint in place, any world size. See :func:`.sharded.load_sharded`.

        Nothing in the directory is unpickled beyond DCP's metadata classes and
        ``weights_only`` (:mod:`~gpu_training.checkpoint.dcp_read`).

        Args:
            model: The model to fill, sharded with ``fully_shard`` or not.
            optimizer: Its optimizer, or None for the weights only.
            path_or_step: A checkpoint directory, a step number, or None for the newest.

        Returns:
            The ``extra`` state saved with it (empty dict if none).

        Raises:
            CheckpointError: On every rank if the checkpoint is missing, damaged or mismatched.
        """
        from gpu_training.checkpoint.sharded import load_sharded

        return load_sharded(self, model, optimizer, path_or_step)

    def save_deepspeed(
        self, engine: Any, step: int, *, extra: Mapping[str, Any] | None = None
    ) -> Path | None:
        """Saves a DeepSpeed engine's checkpoint; every rank. See :func:`.zero.save_deepspeed`.

        Args:
            engine: The ``DeepSpeedEngine``.
            step: The step number (>= 0).
            extra: Plain state to resume with; rank 0's copy.

        Returns:
            The checkpoint directory on rank 0, None on the other ranks.

        Raises:
            CheckpointError: On every rank if any rank failed; nothing is pruned.
        """
        from gpu_training.checkpoint.zero import save_deepspeed

        return save_deepspeed(self, engine, step, extra=extra)

    def load_deepspeed(
        self,
        engine: Any,
        path_or_step: str | os.PathLike[str] | int | None = None,
        *,
        trusted: bool | None = None,
    ) -> dict[str, Any]:
        """Loads a DeepSpeed checkpoint into ``engine``; every rank. See :func:`.zero.load_deepspeed`.

        Args:
            engine: The ``DeepSpeedEngine`` to fill.
            path_or_step: A checkpoint directory, a step number, or None for the newest.
            trusted: Let DeepSpeed unpickle without the allow-list (default:
                ``trust_checkpoint``).

        Returns:
            The ``extra`` state saved with it (empty dict if none).

        Raises:
            CheckpointError: On every rank if there is none, it is damaged or mismatched, or a
                file holds objects outside the allow-list (nothing runs).
        """
        from gpu_training.checkpoint.zero import load_deepspeed

        return load_deepspeed(self, engine, path_or_step, trusted=trusted)

    def __repr__(self) -> str:
        return (
            f"CheckpointManager({str(self.directory)!r}, keep_last_n={self.keep_last_n}, "
            f"rank={self.ctx.rank}/{self.ctx.world_size})"
        )
