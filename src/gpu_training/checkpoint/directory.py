"""One checkpoint root and the only code that changes it: stage, commit, sync, prune, clean.

A root holds ``step-XXXXXXXX/`` directories, each a checkpoint once its ``manifest.json``
(written last) is there, and at most some ``.tmp-*`` directories: saves in progress, or left
by a crash. :class:`CheckpointDirectory` owns that layout for every format. The writers —
rank 0's plain ``state.pt`` (:mod:`~gpu_training.checkpoint.plain`), the every-rank protocol
(:mod:`~gpu_training.checkpoint.collective`) that DCP and DeepSpeed checkpoints use — are
format adapters on it: each writes its files into a :meth:`~CheckpointDirectory.staging`
directory and hands it to :meth:`~CheckpointDirectory.commit`.

The guarantees live here: a staging directory is locked for its whole life (so a cleaner in
another process never removes a save in progress), a commit is one rename (readers see no
step or the whole step), the rename is made durable (:meth:`~CheckpointDirectory.sync`) before
any older checkpoint is pruned, and a prune is a rename to ``.tmp-*`` first (a crash mid-delete
leaves only a temporary directory). No method here is a collective: which rank calls what is
the writers' business.

Example:
    >>> import tempfile
    >>> from gpu_training.checkpoint.files import file_checksum
    >>> store = CheckpointDirectory(tempfile.mkdtemp(), keep_last_n=1)
    >>> for step in (1, 2):
    ...     with store.staging(step) as tmp:
    ...         _ = (tmp / "weights.bin").write_bytes(bytes(8))
    ...         entry = {"name": "weights.bin", "size": 8,
    ...                  "checksum": file_checksum(tmp / "weights.bin")}
    ...         _ = store.write_manifest(tmp, step, world_size=1, files=[entry])
    ...         final = store.commit(tmp, step)
    ...     store.prune(keep=final)
    >>> [p.name for p in store.committed()], store.latest() == final
    (['step-00000002'], True)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpu_training.checkpoint.files import (
    TMP_PREFIX,
    CheckpointError,
    build_manifest,
    check_step,
    exchange,
    fsync_dir,
    make_locked_tmp,
    scan_step_dirs,
    step_name,
    try_lock,
    write_manifest,
)
from gpu_training.checkpoint.offline import Resumable, find_resumable, inspect_step

__all__ = ["CheckpointDirectory", "PathOrStep"]

PathOrStep = str | os.PathLike[str] | int
"""A checkpoint directory, or a step number in the root."""


class CheckpointDirectory:
    """A checkpoint root: its step directories, and the moves that write and remove them.

    Args:
        root: Where ``step-XXXXXXXX/`` directories live; created on the first commit.
        keep_last_n: Committed checkpoints :meth:`prune` keeps (newest by step); None: all.
        config_hash: Recorded in each manifest (a hash of the settings of the run's math).
        config: The settings themselves (plain data), recorded in each manifest as
            ``"config"``, so that a resume can name the fields that changed.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep_last_n: int | None = None,
        config_hash: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.root = Path(root)
        self.keep_last_n = keep_last_n
        self.config_hash = config_hash
        self.config = dict(config) if config is not None else None
        self._unsynced = False  # a commit's rename not yet made durable (see sync)

    # -- reading -------------------------------------------------------------------------------

    def step_dirs(self) -> list[tuple[int, Path]]:
        """Every ``step-XXXXXXXX`` directory, committed or not, by ascending step."""
        return scan_step_dirs(self.root)

    def path_of(self, step: int) -> Path:
        """Where checkpoint ``step`` lives (whether or not it exists)."""
        return self.root / step_name(check_step(step))

    def resolve(self, path_or_step: PathOrStep) -> Path:
        """A step number, a step directory's name relative to the root, or any path."""
        if isinstance(path_or_step, int):  # check_step refuses True/False
            return self.path_of(path_or_step)
        path = Path(path_or_step)
        if not path.is_absolute() and not path.exists() and (self.root / path).exists():
            return self.root / path  # "step-00000010" relative to the root
        return path

    def committed(self) -> list[Path]:
        """Committed checkpoints (valid manifest, listed files present with the right sizes)."""
        return [p for _, p in self.step_dirs() if not inspect_step(p, checksums=False)[1]]

    def latest(self, *, verify_checksums: bool = False) -> Path | None:
        """The newest committed checkpoint (read-only); damaged ones are skipped."""
        for _, path in reversed(self.step_dirs()):
            if not inspect_step(path, checksums=verify_checksums)[1]:
                return path
        return None

    def find_resumable(self, *, verify_checksums: bool = False) -> Resumable:
        """The newest intact checkpoint and the damaged ones newer than it (read-only)."""
        return find_resumable(self.root, verify_checksums=verify_checksums)

    def verify(self, path_or_step: PathOrStep) -> list[str]:
        """Problems of a checkpoint against its manifest (sizes and checksums); [] if intact."""
        return inspect_step(self.resolve(path_or_step), checksums=True)[1]

    def manifest(self, path_or_step: PathOrStep) -> dict[str, Any]:
        """A checkpoint's parsed manifest (files size-checked); CheckpointError if damaged."""
        path = self.resolve(path_or_step)
        manifest, problems = inspect_step(path, checksums=False)
        if manifest is None or problems:
            raise CheckpointError(f"invalid checkpoint {path}: " + "; ".join(problems))
        return manifest

    def newest_verified(
        self,
        candidates: Iterable[Path],
        problems_of: Callable[[Path], list[str]],
        *,
        nothing: str,
        warn: bool = True,
        stacklevel: int = 2,
    ) -> Path:
        """The first candidate (newest first) without problems; warns about those skipped.

        A load with no step named takes the newest checkpoint that verifies, and says which
        newer ones it skipped: the same rule for every format.

        Args:
            candidates: Step directories, newest first.
            problems_of: Verifies one (checksums included); [] when intact.
            nothing: The error when none verifies, e.g. ``"no valid checkpoint in DIR"``.
            warn: Warn about the skipped ones (False on all ranks but one).
            stacklevel: For the warning, counted from the caller of this method.

        Raises:
            CheckpointError: ``nothing``, then every problem found.
        """
        skipped: list[str] = []
        for path in candidates:
            problems = problems_of(path)
            if problems:
                skipped += problems
                continue
            if skipped and warn:
                warnings.warn(
                    f"loading {path}; skipped newer checkpoints that failed verification: "
                    + "; ".join(skipped),
                    stacklevel=stacklevel + 1,
                )
            return path
        raise CheckpointError(nothing + ((": " + "; ".join(skipped)) if skipped else ""))

    # -- writing -------------------------------------------------------------------------------

    def clean_stale(self) -> list[Path]:
        """Removes ``.tmp-*`` directories left by interrupted saves or prunes.

        A directory whose writer is still alive (it holds a lock on it) is left alone.

        Returns:
            The directories removed.
        """
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        with os.scandir(self.root) as entries:
            stale = [
                Path(e.path)
                for e in entries
                if e.name.startswith(TMP_PREFIX) and e.is_dir(follow_symlinks=False)
            ]
        for path in stale:
            try:
                fd = try_lock(path)
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

    @contextlib.contextmanager
    def staging(self, step: int) -> Iterator[Path]:
        """A new, locked ``.tmp-step-XXXXXXXX-<random>`` directory to write checkpoint ``step`` in.

        Creates the root first (durably). On leaving, the lock is released and whatever was
        not committed is removed, so an error at any point leaves no half-written step.
        """
        name = step_name(check_step(step))
        if not self.root.is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            fsync_dir(self.root.parent)
        tmp, lock_fd = make_locked_tmp(self.root, name)
        try:
            yield tmp
        finally:
            try:
                shutil.rmtree(tmp, ignore_errors=True)  # committed: renamed away already
            finally:
                os.close(lock_fd)

    def write_manifest(
        self,
        tmp: Path,
        step: int,
        *,
        world_size: int,
        files: list[dict[str, Any]],
        state_format: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        sync: bool = True,
    ) -> dict[str, Any]:
        """Writes ``tmp/manifest.json`` last, once every file it lists is complete in ``tmp``.

        Args:
            tmp: The staging directory.
            step: The checkpoint's step.
            world_size: Ranks that wrote it.
            files: ``{"name", "size", "checksum"}`` of every state file.
            state_format: ``"dcp"``, ``"deepspeed"``, or None for a plain ``state.pt``.
            metadata: The caller's JSON-serialisable extras.
            sync: fsync the manifest and ``tmp`` (False: the caller syncs them itself).

        Returns:
            The manifest written.
        """
        manifest = build_manifest(
            step,
            world_size,
            files,
            state_format=state_format,
            config_hash=self.config_hash,
            config=self.config,
            metadata=metadata,
        )
        write_manifest(tmp, manifest, sync=sync)
        return manifest

    def commit(self, tmp: Path, step: int) -> Path:
        """Renames a complete staging directory into place as checkpoint ``step``.

        Every file in ``tmp`` must be durable already. An existing step is replaced
        atomically (``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere two renames, where a
        crash in between loses that one step and keeps the older ones). The rename itself is
        made durable by :meth:`sync`, which :meth:`prune` calls before removing anything.

        Returns:
            The step directory.
        """
        final = self.path_of(step)
        if not os.path.lexists(final):
            os.replace(tmp, final)  # atomic: readers see no directory or the whole checkpoint
        elif exchange(tmp, final):  # one atomic swap: there is always a committed step dir
            shutil.rmtree(tmp, ignore_errors=True)  # now holds the old checkpoint
        else:
            old = final.with_name(f"{TMP_PREFIX}old-{final.name}-{secrets.token_hex(4)}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        self._unsynced = True
        return final

    @property
    def unsynced(self) -> bool:
        """True from a :meth:`commit` until the :meth:`sync` that makes its rename durable."""
        return self._unsynced

    def sync(self) -> None:
        """Makes the last commit's rename durable (an fsync of the root), if not done yet.

        Until then a crash of the process loses nothing (the rename is done), and a power
        loss can only take the newest checkpoint back to not existing, never half-written.
        """
        if self._unsynced:
            fsync_dir(self.root)
            self._unsynced = False

    def prune(self, keep: Path) -> None:
        """Removes committed checkpoints older than the newest ``keep_last_n`` (never ``keep``).

        The last commit is made durable first: a power loss must never leave fewer complete
        checkpoints than before. A checkpoint that cannot be removed is a warning, not an
        error: the one just written is fine.
        """
        if self.keep_last_n is None:
            return
        doomed_paths = [p for p in self.committed()[: -self.keep_last_n] if p != keep]
        if doomed_paths:
            self.sync()  # the new checkpoint is durable before an old one goes
        for path in doomed_paths:
            doomed = path.with_name(f"{TMP_PREFIX}prune-{path.name}-{secrets.token_hex(4)}")
            try:
                os.replace(path, doomed)  # atomic: a crash mid-delete leaves a .tmp-* dir only
                shutil.rmtree(doomed)
            except OSError as exc:
                warnings.warn(f"could not remove old checkpoint {path}: {exc}", stacklevel=3)

    def __repr__(self) -> str:
        return f"CheckpointDirectory({str(self.root)!r}, keep_last_n={self.keep_last_n})"
