"""DeepSpeed (ZeRO 1/2/3) checkpoints with the same layout and guarantees as every other kind.

DeepSpeed writes its own files — ``mp_rank_00_model_states.pt`` (or one model shard per rank
under ZeRO-3) and one ``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` per rank — with
``engine.save_checkpoint``. Here they are written into the toolkit's temporary step directory
and committed like a sharded checkpoint (:func:`.collective.save_directory`):
every rank checksums and fsyncs its own files, rank 0 writes ``manifest.json`` last
(``"state_format": "deepspeed"``) and renames ``step-XXXXXXXX/`` into place, so a DeepSpeed
run killed mid-save resumes from the previous complete checkpoint, as any other run does.
DeepSpeed's ``latest`` file is not written: :meth:`CheckpointManager.latest` is the truth.

Trust: DeepSpeed loads its files with ``torch.load(weights_only=False)``. Here its readers run
inside :func:`~gpu_training.checkpoint.safe_load.weights_only_loads`, which forces every load
to ``weights_only=True`` with an allow-list of the plain-data classes DeepSpeed pickles, and
every ``.pt`` file is checked first so that a refusal names the file: a file holding anything
else is refused and nothing in it runs (:mod:`~gpu_training.checkpoint.zero_read`, shared with
the offline reader). ``trusted=True`` (``--trust-checkpoint``) lets DeepSpeed unpickle as it
likes, for checkpoints from a source you trust. For weights to share, consolidate into
``.safetensors`` (``gpu-training ckpt consolidate``).

Example:
    >>> ckpt = CheckpointManager("checkpoints", ctx=ctx)  # doctest: +SKIP
    >>> ckpt.save_deepspeed(engine, step, extra={"step": step})  # every rank  # doctest: +SKIP
    >>> extra = ckpt.load_deepspeed(engine)  # the layout it was written on  # doctest: +SKIP
    >>> state, extra = ckpt.load_into_deepspeed(engine, 10)  # any layout  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_training.checkpoint.attempt import Attempt, settle, uses_process_group
from gpu_training.checkpoint.collective import choose_verified, save_directory
from gpu_training.checkpoint.directory import CheckpointDirectory, PathOrStep
from gpu_training.checkpoint.files import (
    DEEPSPEED_FORMAT,
    EXTRA_NAME,
    MANIFEST_NAME,
    CheckpointError,
)
from gpu_training.checkpoint.formats import DEEPSPEED
from gpu_training.checkpoint.safe_load import load_plain
from gpu_training.checkpoint.zero_read import (
    check_files,
    deepspeed_model_state,
    guarded,
    mapped_loads,
    quiet,
    refusals,
)
from gpu_training.ddp import DistributedContext

__all__ = ["DEEPSPEED_FORMAT", "deepspeed_model_state", "load_deepspeed", "save_deepspeed"]


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
        with quiet():
            # save_dir/tag is the temporary directory itself: DeepSpeed's files land flat in it.
            # frozen parameters (a LoRA base) come back from the model itself: only what trains
            engine.save_checkpoint(
                str(tmp.parent), tag=tmp.name, save_latest=False, exclude_frozen_parameters=True
            )
        return set()

    return save_directory(store, ctx, step, write, DEEPSPEED, extra=extra)


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
    ``path_or_step`` the newest DeepSpeed checkpoint that verifies is taken. DeepSpeed's own
    load, on the world size it was saved with (its optimizer shards are per rank); for
    another world size or stage, ``CheckpointManager.load_into_deepspeed`` reshards.

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
    chosen = choose_verified(store, ctx, path_or_step, DEEPSPEED)
    what = f"could not load {chosen}"
    extra: dict[str, Any] = {}
    with Attempt() as check:
        if not trusted:  # each rank a share: the refusal names the file
            check_files(chosen, slice(ctx.rank, None, ctx.world_size))
        manifest_world = _saved_world_size(chosen)
        if manifest_world != ctx.world_size:
            raise CheckpointError(
                f"{chosen} was saved by {manifest_world} DeepSpeed ranks and this run has "
                f"{ctx.world_size}: DeepSpeed's own load reads its optimizer shards on the same "
                "world size only (CheckpointManager.load_into_deepspeed reshards them)"
            )
    settle(ctx, check, what)
    with Attempt() as load:
        with quiet(), guarded(trusted), refusals(chosen), mapped_loads(engine, trusted):
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


def _saved_world_size(step_dir: Path) -> int:
    manifest = json.loads((step_dir / MANIFEST_NAME).read_text())
    return int(manifest["world_size"])
