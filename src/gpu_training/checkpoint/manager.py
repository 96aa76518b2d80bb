"""Checkpoints that are never half-written: one object to save, find and load them, any format.

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

:class:`CheckpointManager` is a façade: the directory is a
:class:`~gpu_training.checkpoint.directory.CheckpointDirectory` (``manager.store``), and each
format is an adapter on it — :mod:`~gpu_training.checkpoint.plain` (rank 0 writes
``state.pt``), :mod:`~gpu_training.checkpoint.sharded` (DCP) and
:mod:`~gpu_training.checkpoint.zero` (DeepSpeed), both committed by the every-rank protocol of
:mod:`~gpu_training.checkpoint.collective`.

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

import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from gpu_training.checkpoint.directory import CheckpointDirectory, PathOrStep
from gpu_training.checkpoint.offline import Resumable
from gpu_training.checkpoint.plain import MapLocation, PlainFormat
from gpu_training.ddp import DistributedContext

__all__ = ["CheckpointManager"]


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
        self.ctx = ctx if ctx is not None else DistributedContext.from_env()
        self.store = CheckpointDirectory(
            directory, keep_last_n=keep_last_n, config_hash=config_hash, config=config
        )
        """The directory itself: step directories, staging, commit, prune, durability."""
        self.trust_checkpoint = trust_checkpoint
        self._plain = PlainFormat(self.store, self.ctx)
        if self.ctx.is_main_process:
            self.clean_stale()

    @property
    def directory(self) -> Path:
        """Where ``step-XXXXXXXX/`` directories live."""
        return self.store.root

    @property
    def keep_last_n(self) -> int | None:
        """Committed checkpoints kept (the newest by step); None keeps all."""
        return self.store.keep_last_n

    @property
    def config_hash(self) -> str | None:
        """Recorded in each manifest."""
        return self.store.config_hash

    @property
    def config(self) -> dict[str, Any] | None:
        """The settings recorded in each manifest."""
        return self.store.config

    # -- reading -------------------------------------------------------------------------------

    def list_checkpoints(self) -> list[Path]:
        """Committed checkpoints (valid manifest, listed files present with the right sizes).

        Returns:
            Their directories by ascending step.
        """
        return self.store.committed()

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
        return self.store.latest(verify_checksums=verify_checksums)

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
        return self.store.find_resumable(verify_checksums=verify_checksums)

    def verify(self, path_or_step: PathOrStep) -> list[str]:
        """Checks a checkpoint against its manifest: presence, sizes and checksums.

        Args:
            path_or_step: A checkpoint directory or a step number.

        Returns:
            One message per problem; empty when the checkpoint is intact.
        """
        return self.store.verify(path_or_step)

    def manifest(self, path_or_step: PathOrStep) -> dict[str, Any]:
        """The parsed manifest of a checkpoint (its files are size-checked, not hashed).

        Args:
            path_or_step: A checkpoint directory or a step number.

        Returns:
            The manifest: ``step``, ``world_size``, ``config_hash``, ``created``, ``files``...

        Raises:
            CheckpointError: If the checkpoint is missing, uncommitted or damaged.
        """
        return self.store.manifest(path_or_step)

    def load(
        self,
        path_or_step: PathOrStep | None = None,
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
        return self._plain.load(path_or_step, map_location)

    # -- writing -------------------------------------------------------------------------------

    def clean_stale(self) -> list[Path]:
        """Removes ``.tmp-*`` directories left by interrupted saves or prunes.

        A directory whose writer is still alive (it holds a lock on it) is left alone.

        Returns:
            The directories removed.
        """
        return self.store.clean_stale()

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
        return self._plain.save(state, step, metadata=metadata, async_save=async_save)

    @property
    def pending(self) -> bool:
        """True from an asynchronous save until the :meth:`wait` (or save) that collects it.

        The same on every rank (the write itself may be over already), so it is safe to branch
        on before a call that every rank must make.
        """
        return self._plain.pending

    def wait(self) -> Path | None:
        """Waits for a pending asynchronous save and shares its outcome; every rank calls it.

        Returns:
            The committed checkpoint directory on rank 0; None on the other ranks, and when
            no save was pending.

        Raises:
            CheckpointError: On every rank if rank 0 could not write the pending checkpoint.
        """
        return self._plain.wait()

    def close(self) -> None:
        """Waits for a pending asynchronous save (like :meth:`wait`, on every rank).

        Also frees the host buffers kept for the next asynchronous save. Safe to call more
        than once; the manager can still save afterwards.

        Raises:
            CheckpointError: On every rank if the pending save failed.
        """
        self._plain.close()

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
            self._plain.settle_locally()

    # -- sharded (FSDP2) and DeepSpeed checkpoints: checkpoint/sharded.py, checkpoint/zero.py --

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

        self.wait()  # a pending asynchronous plain save commits (and prunes) first
        return save_sharded(self.store, self.ctx, model, optimizer, step, extra=extra)

    def load_sharded(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        path_or_step: PathOrStep | None = None,
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

        return load_sharded(self.store, self.ctx, model, optimizer, path_or_step)

    def load_plain_into(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        path_or_step: PathOrStep | None = None,
    ) -> dict[str, Any]:
        """Loads a plain checkpoint into a sharded (FSDP2) model and its optimizer; every rank.

        Any world size; rank 0 broadcasts tensor by tensor from the memory-mapped file. See
        :func:`.reshard.load_plain_resharded`.

        Args:
            model: The model to fill, sharded with ``fully_shard`` or not.
            optimizer: Its optimizer.
            path_or_step: A checkpoint directory, a step number, or None for the newest.

        Returns:
            The saved state without its model and optimizer (run state and ``"extra"``).

        Raises:
            CheckpointError: On every rank if the checkpoint is missing, damaged or mismatched.
        """
        from gpu_training.checkpoint.reshard import load_plain_resharded

        return load_plain_resharded(self.store, self.ctx, model, optimizer, path_or_step)

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

        self.wait()  # a pending asynchronous plain save commits (and prunes) first
        return save_deepspeed(self.store, self.ctx, engine, step, extra=extra)

    def load_deepspeed(
        self,
        engine: Any,
        path_or_step: PathOrStep | None = None,
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

        trust = self.trust_checkpoint if trusted is None else trusted
        return load_deepspeed(self.store, self.ctx, engine, path_or_step, trusted=trust)

    def load_into_deepspeed(
        self, engine: Any, path_or_step: PathOrStep, *, trusted: bool | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Loads any checkpoint into a fresh ZeRO engine, any layout; every rank.

        A DeepSpeed checkpoint laid out as the engine is goes through :meth:`load_deepspeed`
        (bitwise); another stage or world size, a plain or a sharded checkpoint is read per
        parameter into the engine's partitions. See :func:`.zero_reshard.load_into_deepspeed`.

        Args:
            engine: The ``DeepSpeedEngine`` to fill (ZeRO stage 1-3), not stepped yet.
            path_or_step: A checkpoint directory or a step number.
            trusted: Let DeepSpeed's files unpickle without the allow-list (default:
                ``trust_checkpoint``).

        Returns:
            ``(run_state, extra)``: the run state saved, and the caller's extra.

        Raises:
            CheckpointError: On every rank if it is missing, damaged, refused or of another
                model.
        """
        from gpu_training.checkpoint.zero_reshard import load_into_deepspeed

        trust = self.trust_checkpoint if trusted is None else trusted
        return load_into_deepspeed(self.store, self.ctx, engine, path_or_step, trusted=trust)

    def load_resharded(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        path_or_step: PathOrStep,
        *,
        trusted: bool | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Loads a checkpoint read per parameter into a plain, DDP or FSDP2 run; every rank.

        How a DeepSpeed ZeRO checkpoint resumes without DeepSpeed, at any world size. See
        :func:`.zero_reshard.load_resharded`.

        Args:
            model: The model to fill, sharded with ``fully_shard`` or not.
            optimizer: Its optimizer, built from its parameters.
            path_or_step: A checkpoint directory or a step number.
            trusted: Let DeepSpeed's files unpickle without the allow-list (default:
                ``trust_checkpoint``).

        Returns:
            ``(run_state, extra)``: the run state saved, and the caller's extra.

        Raises:
            CheckpointError: On every rank if it is missing, damaged, refused or of another
                model.
        """
        from gpu_training.checkpoint.zero_reshard import load_resharded

        trust = self.trust_checkpoint if trusted is None else trusted
        return load_resharded(self.store, self.ctx, model, optimizer, path_or_step, trusted=trust)

    def __repr__(self) -> str:
        return (
            f"CheckpointManager({str(self.directory)!r}, keep_last_n={self.keep_last_n}, "
            f"rank={self.ctx.rank}/{self.ctx.world_size})"
        )
