"""DeepSpeed (ZeRO 1/2/3) checkpoints with the same layout and guarantees as every other kind.

DeepSpeed writes its own files — ``mp_rank_00_model_states.pt`` (or one model shard per rank
under ZeRO-3) and one ``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` per rank — with
``engine.save_checkpoint``. Here they are written into the toolkit's temporary step directory
and committed like a sharded checkpoint (:func:`.collective.save_directory`):
every rank checksums its own files, rank 0 writes ``manifest.json`` last
(``"state_format": "deepspeed"``) and renames ``step-XXXXXXXX/`` into place, so a DeepSpeed
run killed mid-save resumes from the previous complete checkpoint, as any other run does.
DeepSpeed's ``latest`` file is not written: :meth:`CheckpointManager.latest` is the truth.

Trust: DeepSpeed loads its files with ``torch.load(weights_only=False)``. Here its readers run
inside :func:`~gpu_training.checkpoint.safe_load.weights_only_loads`, which forces every load
to ``weights_only=True`` with an allow-list of the plain-data classes DeepSpeed pickles, and
every ``.pt`` file is checked first so that a refusal names the file: a file holding anything
else is refused and nothing in it runs. ``trusted=True`` (``--trust-checkpoint``) lets
DeepSpeed unpickle as it likes, for checkpoints from a source you trust. For weights to
share, consolidate into ``.safetensors`` (``gpu-training ckpt consolidate``).

Example:
    >>> ckpt = CheckpointManager("checkpoints", ctx=ctx)  # doctest: +SKIP
    >>> ckpt.save_deepspeed(engine, step, extra={"step": step})  # every rank  # doctest: +SKIP
    >>> extra = ckpt.load_deepspeed(engine)  # same world size  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from gpu_training.checkpoint.attempt import Attempt, settle, uses_process_group
from gpu_training.checkpoint.collective import choose_verified, save_directory
from gpu_training.checkpoint.directory import CheckpointDirectory, PathOrStep
from gpu_training.checkpoint.files import (
    DEEPSPEED_FORMAT,
    EXTRA_NAME,
    MANIFEST_NAME,
    CheckpointError,
)
from gpu_training.checkpoint.offline import load_plain
from gpu_training.checkpoint.safe_load import (
    DEEPSPEED_SAFE_GLOBALS,
    check_pickles,
    refused_message,
    weights_only_loads,
)
from gpu_training.ddp import DistributedContext

__all__ = ["DEEPSPEED_FORMAT", "deepspeed_model_state", "load_deepspeed", "save_deepspeed"]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """DeepSpeed logs a line per file on every rank; only errors should reach the user."""
    import logging

    logger = logging.getLogger("DeepSpeed")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def save_deepspeed(
    store: CheckpointDirectory,
    ctx: DistributedContext,
    engine: Any,
    step: int,
    *,
    extra: Mapping[str, Any] | None = None,
) -> Path | None:
    """Writes a DeepSpeed engine's checkpoint atomically; every rank.

    Usually called as ``CheckpointManager.save_deepspeed(engine, step, extra=...)``.

    Args:
        store: Where to save (the root, ``keep_last_n``, what manifests record).
        ctx: This rank's identity.
        engine: The ``DeepSpeedEngine`` (from :func:`~gpu_training.strategy.deepspeed_initialize`).
        step: The step number (>= 0); an existing checkpoint of that step is replaced.
        extra: Plain state to resume with (step, sampler, RNG...): rank 0's copy is saved.

    Returns:
        The checkpoint directory on rank 0, None on the other ranks.

    Raises:
        CheckpointError: On every rank if any rank failed; nothing is pruned.
    """

    def write(tmp: Path) -> set[str]:
        with _quiet():
            # save_dir/tag is the temporary directory itself: DeepSpeed's files land flat in it.
            # frozen parameters (a LoRA base) come back from the model itself: only what trains
            engine.save_checkpoint(
                str(tmp.parent), tag=tmp.name, save_latest=False, exclude_frozen_parameters=True
            )
        return set()

    return save_directory(store, ctx, step, write, DEEPSPEED_FORMAT, extra=extra)


@contextlib.contextmanager
def _guarded(trusted: bool) -> Iterator[None]:
    """DeepSpeed's own ``torch.load`` calls, forced to ``weights_only`` unless trusted."""
    if trusted:
        yield
        return
    with weights_only_loads(DEEPSPEED_SAFE_GLOBALS):
        yield


def _pickle_files(step_dir: Path, share: slice = slice(None)) -> list[Path]:
    """DeepSpeed's ``.pt`` files the manifest lists (this rank's share), not ``extra.pt``."""
    manifest = json.loads((step_dir / MANIFEST_NAME).read_text())
    names = sorted(
        str(e["name"])
        for e in manifest["files"]
        if str(e["name"]).endswith(".pt") and e["name"] != EXTRA_NAME
    )
    return [step_dir / name for name in names[share]]


def _check_files(step_dir: Path, share: slice = slice(None)) -> None:
    """DeepSpeed's files hold only the allow-listed classes; ``extra.pt`` only plain data.

    ``extra.pt`` is ours, read with ``weights_only`` whatever the trust: its refusal does not
    suggest ``--trust-checkpoint``, which could not help.
    """
    check_pickles(_pickle_files(step_dir, share), DEEPSPEED_SAFE_GLOBALS)
    if share.start in (None, 0) and (step_dir / EXTRA_NAME).exists():
        check_pickles([step_dir / EXTRA_NAME], hint=None)


def load_deepspeed(
    store: CheckpointDirectory,
    ctx: DistributedContext,
    engine: Any,
    path_or_step: PathOrStep | None = None,
    *,
    trusted: bool = False,
) -> dict[str, Any]:
    """Loads a DeepSpeed checkpoint into ``engine`` (model, optimizer, its scheduler); every rank.

    The checksums are verified first (each rank a share of the files); with no
    ``path_or_step`` the newest DeepSpeed checkpoint that verifies is taken. Load on the
    world size it was saved with (DeepSpeed's optimizer shards are per rank); for another
    world size, consolidate the weights and start a new optimizer.

    Args:
        store: The checkpoint root.
        ctx: This rank's identity.
        engine: The ``DeepSpeedEngine`` to fill (same model and ZeRO stage).
        path_or_step: A checkpoint directory, a step number, or None for the newest.
        trusted: Let DeepSpeed unpickle its files without the ``weights_only`` allow-list.

    Returns:
        The ``extra`` state saved with the checkpoint (an empty dict if there was none).

    Raises:
        CheckpointError: On every rank, if there is none, it fails verification, was saved
            on another world size, holds objects outside the allow-list (nothing runs), or
            DeepSpeed could not load it.
    """
    uses_process_group(ctx)
    chosen = choose_verified(store, ctx, path_or_step, DEEPSPEED_FORMAT)
    what = f"could not load {chosen}"
    extra: dict[str, Any] = {}
    with Attempt() as check:
        if not trusted:  # each rank a share: the refusal names the file
            _check_files(chosen, slice(ctx.rank, None, ctx.world_size))
        manifest_world = _saved_world_size(chosen)
        if manifest_world != ctx.world_size:
            raise CheckpointError(
                f"{chosen} was saved by {manifest_world} DeepSpeed ranks and this run has "
                f"{ctx.world_size}: DeepSpeed's optimizer shards load on the same world size "
                "only (consolidate the weights with 'gpu-training ckpt consolidate' to change it)"
            )
    settle(ctx, check, what)
    with Attempt() as load:
        with _quiet(), _guarded(trusted), _refusals(chosen):
            path, _ = engine.load_checkpoint(
                str(chosen.parent),
                tag=chosen.name,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
            )
        if path is None:
            raise CheckpointError(f"DeepSpeed found no checkpoint files in {chosen}")
        if (chosen / EXTRA_NAME).exists():
            extra = load_plain(chosen / EXTRA_NAME)
    settle(ctx, load, what)
    return extra


@contextlib.contextmanager
def _refusals(step_dir: Path) -> Iterator[None]:
    """A ``weights_only`` refusal inside DeepSpeed becomes one CheckpointError naming the step."""
    try:
        yield
    except Exception as exc:
        message = refused_message(step_dir, exc)
        if message is None:
            raise
        raise CheckpointError(message) from exc


def _saved_world_size(step_dir: Path) -> int:
    manifest = json.loads((step_dir / MANIFEST_NAME).read_text())
    return int(manifest["world_size"])


def deepspeed_model_state(step_dir: Path, *, trusted: bool = False) -> dict[str, torch.Tensor]:
    """The full fp32 weights of a DeepSpeed ZeRO checkpoint, gathered from every rank's shards.

    Offline, in one process (DeepSpeed's ``zero_to_fp32``), its loads forced to
    ``weights_only`` with the allow-list unless ``trusted``.

    Args:
        step_dir: A committed ``step-XXXXXXXX`` directory of format ``"deepspeed"``.
        trusted: Let DeepSpeed unpickle without the allow-list (``--trust-checkpoint``).

    Returns:
        ``{name: tensor}`` as the unwrapped model's ``state_dict`` names them.

    Raises:
        CheckpointError: If the deepspeed extra is missing, a file holds objects outside the
            allow-list (nothing runs), or the files cannot be read.
    """
    if not trusted:
        _check_files(step_dir)
    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError as exc:
        raise CheckpointError(
            f"{step_dir} is a DeepSpeed checkpoint: reading it needs the deepspeed extra "
            "(pip install 'gpu-training[deepspeed]')"
        ) from exc
    try:
        with _quiet(), _guarded(trusted), _refusals(step_dir):
            state = get_fp32_state_dict_from_zero_checkpoint(
                str(step_dir.parent), tag=step_dir.name
            )
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"could not read {step_dir}: {type(exc).__name__}: {exc}") from exc
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
