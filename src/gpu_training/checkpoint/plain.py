"""The plain format: one ``state.pt`` written by rank 0, synchronously or in the background.

A plain checkpoint is ``step-XXXXXXXX/state.pt`` (one ``torch.save``) and ``manifest.json``.
:class:`PlainFormat` is its adapter on a :class:`~gpu_training.checkpoint.directory.CheckpointDirectory`:
rank 0 streams the state into a staging directory while hashing the same bytes, checks that
``torch.load(weights_only=True)`` reads it back, writes the manifest last, fsyncs everything
(concurrently: they share one journal commit) and commits; then the outcome is broadcast, so
every rank returns from a save together and a failure on rank 0 is raised on every rank.

An asynchronous save copies the state to host memory (:func:`snapshot_state`) and writes it
in a background thread by the same path; its outcome is exchanged at the next save, ``wait``
or ``close`` (every rank calls them), and a pending save is still completed at interpreter
exit. Loading verifies sizes and checksums against the manifest, then reads with
``weights_only=True``: nothing in a checkpoint is unpickled as an arbitrary object.

Example:
    >>> import tempfile, torch
    >>> from gpu_training.checkpoint.directory import CheckpointDirectory
    >>> from gpu_training.ddp import DistributedContext
    >>> plain = PlainFormat(CheckpointDirectory(tempfile.mkdtemp()), DistributedContext())
    >>> plain.save({"w": torch.ones(2)}, step=4).name
    'step-00000004'
    >>> plain.load(4)["w"].tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import json
import os
import pickle  # only for pickle.UnpicklingError: nothing here unpickles with pickle
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import torch
import torch.distributed as dist

from gpu_training.checkpoint.directory import CheckpointDirectory, PathOrStep
from gpu_training.checkpoint.files import (
    MANIFEST_NAME,
    STATE_NAME,
    CheckpointError,
    HashingWriter,
    check_step,
    fsync_dir,
    fsync_file,
    refused_by_environment,
)
from gpu_training.checkpoint.keys import strip_wrapper_prefixes
from gpu_training.checkpoint.offline import inspect_step
from gpu_training.checkpoint.safe_load import check_loads_back, refused_message
from gpu_training.checkpoint.snapshot import Snapshot, StagingBuffers, snapshot_state
from gpu_training.checkpoint.zip_crc import without_zip_crc32
from gpu_training.ddp import DistributedContext
from gpu_training.process_group import collective_device, process_group_up

__all__ = ["MapLocation", "PlainFormat"]

MapLocation = str | torch.device | dict[str, str] | Callable[..., Any] | None

_STATUS_BYTES = 4096  # rank 0's error message travels to the other ranks in this many bytes


@dataclass(eq=False)
class _SaveOutcome:
    """What rank 0's write of one checkpoint came to; an async save's writer fills it in."""

    step: int
    path: Path | None = None
    failure: CheckpointError | None = None
    interrupt: BaseException | None = None
    thread: threading.Thread | None = None


_UNSETTLED: weakref.WeakSet[PlainFormat] = weakref.WeakSet()
"""Writers with a save in flight or a rename not yet durable: exit settles them."""


def _settle_all_at_exit() -> None:
    for writer in list(_UNSETTLED):
        writer.settle_locally()


@functools.cache
def _install_exit_hook() -> None:
    # threading's exit hooks run before concurrent.futures stops taking work, which the writer
    # needs; plain atexit hooks run after that, too late to let a pending save finish
    register = getattr(threading, "_register_atexit", atexit.register)
    register(_settle_all_at_exit)


class PlainFormat:
    """Plain (full-state) checkpoints in ``store``: rank 0 writes, every rank calls.

    Args:
        store: The checkpoint root it commits into.
        ctx: This process's rank identity.
    """

    def __init__(self, store: CheckpointDirectory, ctx: DistributedContext) -> None:
        self.store = store
        self.ctx = ctx
        self._pending: _SaveOutcome | None = None
        self._staging: StagingBuffers = {}  # host buffers of the last async snapshot

    # -- loading -------------------------------------------------------------------------------

    def load(
        self, path_or_step: PathOrStep | None = None, map_location: MapLocation = "cpu"
    ) -> dict[str, Any]:
        """Loads a checkpoint after verifying it (see :meth:`CheckpointManager.load`)."""
        if path_or_step is not None:
            path = self.store.resolve(path_or_step)
            problems = inspect_step(path, checksums=True)[1]
            if problems:
                raise CheckpointError(f"refusing to load {path}: " + "; ".join(problems))
            return self._load_verified(path, map_location)
        if self.ctx.is_main_process:
            self.store.clean_stale()
        chosen = self.store.newest_verified(
            (path for _, path in reversed(self.store.step_dirs())),
            lambda path: inspect_step(path, checksums=True)[1],
            nothing=f"no valid checkpoint in {self.store.root}",
            stacklevel=3,
        )
        return self._load_verified(chosen, map_location)

    @staticmethod
    def _load_verified(path: Path, map_location: MapLocation) -> dict[str, Any]:
        file = path / STATE_NAME
        if not file.exists() and (path / ".metadata").exists():  # DCP's index file
            raise CheckpointError(
                f"{path} is a sharded (DCP) checkpoint: load it with load_sharded()"
            )
        try:
            # mapped: the ranks share the page cache's copy, and each copies once, into its model
            state = torch.load(file, map_location=map_location, weights_only=True, mmap=True)
        except pickle.UnpicklingError as exc:
            # one line, and not torch's advice to re-run with weights_only=False
            raise CheckpointError(refused_message(file, exc, hint=None) or str(exc)) from exc
        except Exception as exc:
            raise CheckpointError(f"could not load {file}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(state, dict):
            raise CheckpointError(f"{file} holds a {type(state).__name__}, expected a dict")
        return state

    # -- saving --------------------------------------------------------------------------------

    def save(
        self,
        state: Mapping[str, Any],
        step: int,
        *,
        metadata: Mapping[str, Any] | None = None,
        async_save: bool = False,
    ) -> Path | None:
        """Writes ``state`` as checkpoint ``step`` (see :meth:`CheckpointManager.save`)."""
        check_step(step)
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
        """True from an asynchronous save until the wait (or save) that collects it."""
        return self._pending is not None

    def wait(self) -> Path | None:
        """Waits for a pending asynchronous save and shares its outcome; every rank calls it."""
        outcome = self._pending
        if outcome is None:
            self.store.sync()
            return None
        if outcome.thread is not None:
            outcome.thread.join()
        self._pending = None  # before raising: the error is reported once, the next save runs
        self.store.sync()
        return self._conclude(outcome)

    def close(self) -> None:
        """:meth:`wait`, then frees the host buffers kept for the next asynchronous save."""
        try:
            self.wait()
        finally:
            _UNSETTLED.discard(self)
            self._staging = {}

    def settle_locally(self) -> None:
        """Joins the writer without a collective; a failure becomes a warning, not an error.

        For when the other ranks may never reach a collective (an error is unwinding) and at
        interpreter exit.
        """
        outcome, self._pending = self._pending, None
        _UNSETTLED.discard(self)
        if outcome is not None and outcome.thread is not None:
            outcome.thread.join()
        with contextlib.suppress(OSError):
            self.store.sync()
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
            copier = Snapshot(spares=self._staging)
            snapshot = copier.run(state)
            self._staging = copier.buffers  # free again once this save is written
            extras = None if metadata is None else snapshot_state(dict(metadata))
        except Exception as exc:  # reported like a failed write, on every rank, at wait()
            outcome.failure = self._save_error(outcome.step, exc)
        except BaseException:
            outcome.failure = CheckpointError(
                f"could not save step {outcome.step} to {self.store.root}: interrupted"
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
            _UNSETTLED.add(self)
            outcome.thread.start()
        self._pending = outcome
        return self.store.path_of(outcome.step)

    def _write_and_prune(
        self, state: Mapping[str, Any], metadata: Mapping[str, Any] | None, outcome: _SaveOutcome
    ) -> None:
        """Rank 0's part of a save; records the result in ``outcome`` instead of raising."""
        try:
            outcome.path = self._write(state, outcome.step, metadata)
            self.store.prune(keep=outcome.path)
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
            f"could not save step {step} to {self.store.root}: {type(exc).__name__}: {exc}{hint}"
        )
        failure.__cause__ = exc
        return failure

    def _conclude(self, outcome: _SaveOutcome) -> Path | None:
        """Shares rank 0's outcome with every rank and raises a failure everywhere."""
        interrupt, failure = outcome.interrupt, outcome.failure
        message = f"{type(interrupt).__name__} on rank 0" if interrupt else None
        refused = failure is not None and refused_by_environment(failure)
        remote = self._share_status(str(failure) if failure else message, refused)
        if interrupt is not None:
            raise interrupt
        if failure is not None:
            raise failure
        if remote is not None:
            text, by_environment = remote
            relayed = CheckpointError(
                f"rank 0 failed to save step {outcome.step} to {self.store.root}: {text}"
            )
            if by_environment:  # a full disk on rank 0 is bad input on every rank alike
                raise relayed from OSError(text)
            raise relayed
        return outcome.path

    def _share_status(
        self, message: str | None, by_environment: bool = False
    ) -> tuple[str, bool] | None:
        """Broadcasts rank 0's outcome; returns its error message and whether the file
        system refused the write (None on success).

        This collective is also the barrier: no rank returns from save() before rank 0 has
        finished writing, and a failure on rank 0 reaches the ranks instead of hanging them.
        """
        if not (self.ctx.is_distributed and process_group_up()):
            return None if message is None else (message, by_environment)
        status = torch.zeros(_STATUS_BYTES, dtype=torch.uint8)
        if self.ctx.is_main_process and message is not None:
            raw = message.encode("utf-8", errors="replace")[: _STATUS_BYTES - 1]
            status[0] = 2 if by_environment else 1
            status[1 : 1 + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        device_status = status.to(collective_device())
        dist.broadcast(device_status, src=0)
        status = device_status.cpu()
        if int(status[0]) == 0:
            return None
        text = bytes(status[1:].tolist()).rstrip(b"\0").decode("utf-8", errors="replace")
        return text, int(status[0]) == 2

    def _write(self, state: Mapping[str, Any], step: int, metadata: Any) -> Path:
        """Writes and commits one checkpoint; removes its staging directory on any error."""
        extras = json.loads(json.dumps(dict(metadata or {})))  # fail before writing anything
        clean_state = strip_wrapper_prefixes(state)
        with (
            self.store.staging(step) as tmp,
            ThreadPoolExecutor(3, thread_name_prefix="checkpoint") as pool,
        ):
            with open(tmp / STATE_NAME, "wb") as raw:
                sink = HashingWriter(raw, pool)
                try:
                    with without_zip_crc32():  # the manifest's checksum covers every byte
                        torch.save(clean_state, cast(IO[bytes], sink))
                except Exception as exc:
                    if sink.error is not None and sink.error is not exc:
                        raise sink.error from exc  # the real cause, not "unexpected pos"
                    raise
                raw.flush()
                on_disk = os.fstat(raw.fileno()).st_size
                if on_disk != sink.size:
                    raise OSError(f"{tmp / STATE_NAME}: {on_disk} bytes on disk, {sink.size} sent")
                entry = {"name": STATE_NAME, "size": sink.size, "checksum": sink.checksum.text()}
                self.store.write_manifest(
                    tmp,
                    step,
                    world_size=self.ctx.world_size,
                    files=[entry],
                    metadata=extras,
                    sync=False,
                )
                # concurrent fsyncs share one journal commit
                jobs = [
                    pool.submit(os.fsync, raw.fileno()),
                    pool.submit(fsync_file, tmp / MANIFEST_NAME),
                    pool.submit(fsync_dir, tmp),
                ]
                final = self.store.path_of(step)
                try:
                    check_loads_back(
                        # mmap: reads the pickle and maps the tensors without copying them
                        lambda: torch.load(
                            tmp / STATE_NAME, map_location="cpu", weights_only=True, mmap=True
                        ),
                        f"not saving {final}: the state",
                    )
                finally:
                    for job in jobs:  # wait before the files close, even on error
                        job.exception()
                for job in jobs:
                    job.result()
            # everything in tmp is durable: one rename makes it a checkpoint. Making the rename
            # itself durable (a second journal commit) is deferred until something depends on
            # it: store.prune, wait, close and exit.
            self.store.commit(tmp, step)
            _UNSETTLED.add(self)  # so that exit makes it durable too
            _install_exit_hook()
        return final
