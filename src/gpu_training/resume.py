"""Everything a step depends on, in one checkpointable dict — and back.

Exact resume needs more than weights: the optimizer's moments, the LR schedule's position,
the fp16 loss scale, where the sampler is in its epoch, and every rank's random-number
state. :func:`capture_training_state` collects them (a collective: every rank calls it; the
per-rank RNG states are gathered to rank 0, which is the rank that writes), and
:func:`restore_training_state` puts them back on every rank.

Example:
    >>> import tempfile, torch
    >>> from gpu_training.checkpoint import CheckpointManager
    >>> from gpu_training.ddp import DistributedContext
    >>> ctx = DistributedContext()
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = torch.optim.AdamW(model.parameters())
    >>> ckpt = CheckpointManager(tempfile.mkdtemp(), ctx=ctx)
    >>> _ = ckpt.save(capture_training_state(ctx, model, opt, step=3), step=3)
    >>> restore_training_state(ckpt.load(), ctx, model, opt)
    3
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from gpu_training.amp import MixedPrecisionStepper
from gpu_training.checkpoint.formats import (
    checkpoint_format,
    format_of,
    load_model_and_optimizer,
    plain_training_state,
)
from gpu_training.checkpoint.loss_scale import carry_into_stepper, loss_scale_of
from gpu_training.config import ConfigError
from gpu_training.ddp import DistributedContext
from gpu_training.job import JobConfig
from gpu_training.rng import gather_rng_states, restore_rng_state, seed_everything

__all__ = [
    "ResumeError",
    "StatefulSampler",
    "capture_run_state",
    "capture_training_state",
    "check_resumable",
    "layout_change",
    "load_model_and_optimizer",
    "plain_training_state",
    "restore_run_state",
    "restore_training_state",
]


class StatefulSampler(Protocol):
    """A sampler whose position can be saved (e.g. :class:`gpu_training.data.GlobalBatchSampler`)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def capture_training_state(
    ctx: DistributedContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    amp: MixedPrecisionStepper | None = None,
    sampler: StatefulSampler | None = None,
    generators: Mapping[str, torch.Generator] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The state of a data-parallel run at an optimizer-step boundary.

    A collective (the RNG states of all ranks are gathered): call it on every rank, then
    hand the result to ``CheckpointManager.save`` on every rank (only rank 0's is written).

    Args:
        ctx: This process's context.
        model: The (possibly wrapped) model; its unwrapped ``state_dict`` is saved.
        optimizer: Its ``state_dict`` is saved.
        step: Optimizer steps completed.
        scheduler: LR scheduler to save.
        amp: The mixed-precision stepper (loss scale, skipped steps).
        sampler: Sampler with ``state_dict`` (epoch and position).
        generators: Named private generators (e.g. each DataLoader's ``generator``).
        extra: Plain data of the caller's (epoch counters, best metric...).

    Returns:
        A dict of tensors and plain data that loads with ``weights_only=True``.
    """
    run = capture_run_state(
        ctx, step=step, scheduler=scheduler, amp=amp, sampler=sampler, generators=generators
    )
    return plain_training_state(run, model, optimizer, extra)


def capture_run_state(
    ctx: DistributedContext,
    *,
    step: int,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    amp: MixedPrecisionStepper | None = None,
    sampler: StatefulSampler | None = None,
    generators: Mapping[str, torch.Generator] | None = None,
) -> dict[str, Any]:
    """Everything a step depends on but the model and the optimizer: plain data, any format.

    :func:`capture_training_state` is this plus the model and optimizer states; a sharded
    format (DCP, DeepSpeed) saves those its own way and this beside them. A collective (the
    RNG states are gathered): call it on every rank.
    """
    return {
        "step": int(step),
        "world_size": ctx.world_size,
        "scheduler_state": scheduler.state_dict() if scheduler is not None else None,
        "amp_state": amp.state_dict() if amp is not None else None,
        "sampler_state": sampler.state_dict() if sampler is not None else None,
        "rng_states": gather_rng_states(ctx, generators),
    }


def restore_training_state(
    state: Mapping[str, Any],
    ctx: DistributedContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    amp: MixedPrecisionStepper | None = None,
    sampler: StatefulSampler | None = None,
    generators: Mapping[str, torch.Generator] | None = None,
    seed: int = 0,
) -> int:
    """Put a captured state back, on every rank; returns the step to continue from.

    On the world size it was saved at, every rank gets its own RNG state back, so the run
    continues bitwise as if it had not stopped. On another world size the sampler still
    continues the same sequence of global batches, but per-rank random streams (dropout)
    cannot continue: rank ``r`` restores rank ``r``'s state where one was saved and is
    reseeded from ``(seed, step, r)`` otherwise — deterministic, not identical.

    Raises:
        KeyError: When the state lacks something that was asked to be restored.
    """
    load_model_and_optimizer(state, model, optimizer)
    return restore_run_state(
        state, ctx, scheduler=scheduler, amp=amp, sampler=sampler, generators=generators, seed=seed
    )


def restore_run_state(
    state: Mapping[str, Any],
    ctx: DistributedContext,
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    amp: MixedPrecisionStepper | None = None,
    sampler: StatefulSampler | None = None,
    generators: Mapping[str, torch.Generator] | None = None,
    seed: int = 0,
) -> int:
    """Put back what :func:`capture_run_state` saved, on every rank; returns the step.

    The one place that decides how random streams continue, for every checkpoint format: on
    the saved world size each rank gets its own state back; a rank that has none (the run
    grew) is reseeded from ``(seed, step, rank)`` and its shared-purpose generators (data
    loaders) continue from rank 0's. The restored schedule sets the optimizer's learning
    rate (a checkpoint resharded from another layout carries no param groups); a DeepSpeed
    checkpoint's ``amp_state`` is None (its engine keeps the loss scale): an fp16 stepper
    resuming it takes the scale its reader found in DeepSpeed's files
    (:mod:`~gpu_training.checkpoint.loss_scale`).

    Raises:
        KeyError: When the state lacks something that was asked to be restored.
    """
    for name, target in (
        ("scheduler_state", scheduler),
        ("amp_state", amp),
        ("sampler_state", sampler),
    ):
        if target is None:
            continue
        saved = state.get(name)
        if saved is None and name == "amp_state" and name in state:
            if amp is not None:  # DeepSpeed keeps its loss scale in its files; its reader found it
                carry_into_stepper(amp, loss_scale_of(state))
            continue
        if saved is None:
            raise KeyError(f"checkpoint has no {name} to restore")
        if target is amp and amp is not None and not saved.get("scaler"):
            # no loss scale to carry: its precision names how the strategy computed (FSDP's
            # policy or autocast), which the job's precision, guarded on resume, decides
            saved = {**saved, "precision": amp.precision}
        target.load_state_dict(saved)
        if target is scheduler and scheduler is not None:
            # the schedule's position sets the LR, whichever optimizer state came with it
            groups, lrs = scheduler.optimizer.param_groups, scheduler.get_last_lr()
            for group, lr in zip(groups, lrs, strict=True):
                group["lr"] = lr
    step = int(state["step"])
    rng_states = state.get("rng_states") or []
    if ctx.rank < len(rng_states):
        restore_rng_state(rng_states[ctx.rank], generators)
    else:
        seed_everything(seed + 1_000_003 * step, rank=ctx.rank)
        if rng_states:  # shared-purpose generators (data loaders) continue from rank 0's
            restore_rng_state(rng_states[0], generators, global_state=False)
    return step


# ----------------------------------------------------------------------------------------------
# may this job resume from that checkpoint?


class ResumeError(ConfigError):
    """The job cannot resume from its checkpoint directory as it stands: bad input, one line.

    Raised before anything is loaded or overwritten (damaged checkpoints in the way, another
    checkpoint format, changed settings without ``allow_config_change``), or when a load is
    refused (a model of another shape, a file outside the allow-list).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, "checkpoint.dir")


def check_resumable(
    job: JobConfig,
    step_dir: Path,
    manifest: Mapping[str, Any],
    *,
    allow_config_change: bool = False,
) -> list[str]:
    """Whether ``job`` may continue from the checkpoint ``step_dir``; returns warnings.

    The checkpoint must be of a format the job's strategy can load (every format loads every
    other's, :meth:`~gpu_training.checkpoint.CheckpointFormat.can_load`), and its recorded
    job settings must match on every field that changes the math
    (:meth:`JobConfig.math_settings`: not the strategy's layout), unless
    ``allow_config_change``; fields that cannot change the math (logging cadence, output
    paths) only warn.

    Args:
        job: The job about to run.
        step_dir: The checkpoint it would resume from.
        manifest: Its parsed manifest.
        allow_config_change: Resume even though math-relevant settings changed.

    Returns:
        One line per change that is allowed, to print as a warning.

    Raises:
        ResumeError: Naming the fields that changed and ``--allow-config-change``, or the
            format mismatch.
    """
    found = format_of(manifest)
    expected = checkpoint_format(job.strategy.checkpoint_format)
    if not expected.can_load(found):
        raise ResumeError(
            f"{step_dir} is a {found.title} checkpoint and strategy "
            f"'{job.strategy.name}' resumes {expected.title} ones: "
            "use the strategy it was written with, or another checkpoint.dir for a new run "
            "(gpu-training ckpt consolidate turns it into plain weights)"
        )
    saved = manifest.get("config")
    if isinstance(saved, Mapping):
        math, other = job.changes_since(saved)
    else:  # written before manifests recorded the settings: only the hash can tell
        same = manifest.get("config_hash") in (None, *job.config_hashes())
        math, other = ([] if same else ["fields unknown: the manifest records only a hash"]), []
    warnings = [
        f"{step_dir.name} was written with {line} (does not change the math)" for line in other
    ]
    if not math:
        return warnings
    listed = "; ".join(math)
    if not allow_config_change:
        raise ResumeError(
            f"the job's settings differ from those {step_dir} was written with: {listed}; "
            "resuming would change the run's math midway: restore them, or pass "
            "--allow-config-change (allow_config_change=True) to resume anyway, or use another "
            "checkpoint.dir for a new run"
        )
    return [*warnings, f"resuming {step_dir.name} with changed settings: {listed}"]


def layout_change(job: JobConfig, manifest: Mapping[str, Any], world_size: int) -> str | None:
    """How a resume lays the run out anew, in words; None when it is laid out as written.

    The strategy and world size the checkpoint was written with (its manifest's recorded
    ``strategy``, else its format) against the job's on ``world_size`` ranks, whether the
    optimizer state is resharded on the way (either side shards it) and whether an fp16 loss
    scale is carried (:mod:`~gpu_training.checkpoint.loss_scale`).

    Example:
        >>> job = JobConfig.from_dict({"strategy": "fsdp"})
        >>> layout_change(job, {"world_size": 2, "config": {"strategy": {"name": "ddp"}}}, 4)
        'written by DDP on 2 ranks under FSDP on 4: optimizer state resharded'
        >>> layout_change(job, {"world_size": 4, "state_format": "dcp",
        ...                     "config": {"strategy": {"name": "fsdp"}}}, 4) is None
        True
    """
    saved, target = format_of(manifest), checkpoint_format(job.strategy.checkpoint_format)
    config = manifest.get("config")
    strategy = config.get("strategy") if isinstance(config, Mapping) else None
    ranks = int(manifest.get("world_size") or 1)
    if not isinstance(strategy, Mapping) and saved is target and ranks == world_size:
        return None  # no strategy recorded: the format and world size are all there is to tell
    then = _strategy_title(strategy) if isinstance(strategy, Mapping) else saved.title
    now = _strategy_title(job.strategy.to_dict())
    if (then, ranks) == (now, world_size):
        return None
    line = f"written by {then} on {ranks} rank{'s' * (ranks != 1)} under {now} on {world_size}"
    notes = ["optimizer state resharded"] if saved.shards or target.shards else []
    training = config.get("training") if isinstance(config, Mapping) else None
    was = training.get("precision") if isinstance(training, Mapping) else None
    if job.training.precision == "fp16" and was in ("fp16", None):  # None: not recorded
        notes.append("fp16 loss scale carried")  # GradScaler's <-> DeepSpeed's: loss_scale.py
    return line + (f": {', '.join(notes)}" if notes else "")


def _strategy_title(strategy: Mapping[str, Any]) -> str:
    """A strategy as the resume line names it: ``DDP``, ``ZeRO-3 with CPU offload``..."""
    name = str(strategy.get("name"))
    if name == "deepspeed":
        stage = strategy.get("zero_stage")
        offload = strategy.get("offload")
        offloads = offload in ("optimizer", "all") or (
            offload is None and strategy.get("cpu_offload")
        )
        return (f"ZeRO-{stage}" if stage else "DeepSpeed") + (" with CPU offload" * bool(offloads))
    degree = strategy.get("tensor_parallel") or 1
    if name == "fsdp" and isinstance(degree, int) and degree > 1:
        return f"FSDP x TP {degree}"
    return {"none": "a plain model", "ddp": "DDP", "fsdp": "FSDP"}.get(name, name)
