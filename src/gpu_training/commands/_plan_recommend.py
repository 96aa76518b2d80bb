"""What ``gpu-training plan`` recommends: the strategy, the batch, the learning rate, the launch.

The strategy follows the guide's decision tree on the measured profile
(:func:`choose_for`, least sharding first: :func:`preference`); the per-device batch is the
largest that fits with the safety margin and divides the global batch's per-GPU share
(:func:`plan_batch`); the learning rate is scaled to the global batch; the launch command
trains the job (or a job file written for a task) with that strategy and batch.
"""

from __future__ import annotations

import argparse
import math
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_training.commands._plan_subject import Subject

if TYPE_CHECKING:
    from gpu_training.memory import MemoryEstimate
    from gpu_training.strategy import StrategyChoice

__all__ = [
    "JOB_FILE",
    "BatchPlan",
    "Launch",
    "choose_for",
    "launch_commands",
    "layout_of",
    "learning_rate",
    "plan_batch",
    "preference",
]

JOB_FILE = "job.yaml"  # what the launch command of a task (not a job file) runs
_HEAD = "HEAD_NODE:29500"
_TRAINING_FLAGS = {  # plan flags that the printed job carries as training fields
    "precision": "precision",
    "lr": "learning_rate",
    "base_batch": "base_batch_size",
    "lr_scaling": "lr_scaling",
}
_LAUNCH_STRATEGY: dict[str, dict[str, Any]] = {
    "ddp": {"name": "ddp"},
    "none": {"name": "none"},
    "fsdp": {"name": "fsdp"},
    "zero3_offload": {"name": "deepspeed", "zero_stage": 3, "offload": "optimizer"},
}

_PREFERENCE = {"none": 0, "ddp": 0, "fsdp": 1}


def preference(choice: StrategyChoice) -> int:
    """Lower is better: no sharding, then FSDP, then DeepSpeed; a choice that does not fit last."""
    if not choice.fits:
        return 3
    return _PREFERENCE.get(choice.strategy, 2)


def layout_of(choice: StrategyChoice) -> str:
    """The memory layout a choice trains with (``ddp``, ``fsdp`` or ``zero3_offload``)."""
    if choice.strategy in ("none", "ddp", "fsdp"):
        return "ddp" if choice.strategy == "none" else choice.strategy
    return "zero3_offload"


def choose_for(
    subject: Subject, args: argparse.Namespace, batch: int, checkpointing: bool
) -> StrategyChoice:
    """The guide's decision tree for ``subject`` at per-device ``batch`` on ``--gpus`` GPUs."""
    from gpu_training.memory import ModelStateBytes
    from gpu_training.strategy import CANDIDATES, choose_strategy

    p = subject.profile
    n = args.gpus

    def estimate(strategy: str, gpus: int) -> MemoryEstimate:
        return p.estimate(
            batch,
            strategy=strategy,
            world_size=gpus,
            activation_checkpointing=checkpointing,
            overhead_bytes=args.overhead,
        )

    return choose_strategy(
        p.num_params,
        gpu_memory_bytes=args.gpu_memory,
        num_gpus=n,
        activation_bytes=p.activation_bytes(batch, checkpointing),
        overhead_bytes=args.overhead,
        state_bytes=ModelStateBytes(p.parameter_bytes, p.gradient_bytes, p.optimizer_bytes),
        candidate_bytes={c: estimate(c, n).allocated for c in CANDIDATES},
        fsdp_bytes=lambda k: estimate("fsdp", k).allocated,
    )


@dataclass
class BatchPlan:
    """The per-device batch, the accumulation and the global batch they make."""

    micro: int
    accumulation: int
    global_batch: int
    largest_fitting: int | None
    note: str


def plan_batch(
    subject: Subject,
    args: argparse.Namespace,
    layout: str,
    checkpointing: bool,
    tensor_parallel: int = 1,
) -> BatchPlan:
    """The largest per-device batch that fits with the margin (or ``--micro-batch``), split
    so that it divides the global batch's per-GPU share.

    With ``tensor_parallel=t`` the share and the batch are a data-parallel group's: its
    ``t`` GPUs train the same samples, so the global batch splits over ``--gpus / t``.

    Raises:
        UsageError: When ``--global-batch`` or ``--micro-batch`` do not split over the GPUs.
    """
    from gpu_training.batch_finder import (
        BatchSizeError,
        margin_ceiling,
        per_device_batch_for_share,
        search_max_batch_size,
    )
    from gpu_training.cli import UsageError
    from gpu_training.config import global_batch_split_message

    n = args.gpus // tensor_parallel  # data-parallel groups
    share = "per-GPU share" if tensor_parallel == 1 else "per-group share"
    margin = args.safety_margin
    global_batch = args.global_batch
    if global_batch is None and subject.job is not None:
        global_batch = subject.job.training.global_batch_size
    if global_batch is not None and global_batch % n:
        where = f"--gpus {n}" if tensor_parallel == 1 else f"the {n} data-parallel groups"
        raise UsageError(
            f"plan: --global-batch {global_batch} is not a multiple of {where}: "
            f"{global_batch_split_message(global_batch, 1, n)}"
        )
    per_rank = global_batch // n if global_batch is not None else None

    def fits(batch: int) -> bool:
        est = subject.profile.estimate(
            batch,
            strategy=layout,
            world_size=args.gpus,
            activation_checkpointing=checkpointing,
            overhead_bytes=args.overhead,
            tensor_parallel=tensor_parallel,
        )
        return est.total <= args.gpu_memory

    # With a global batch, search just far enough to know whether the per-GPU share fits
    # with the margin kept: a larger per-device batch is of no use to this job.
    ceiling = (
        margin_ceiling(per_rank, margin)
        if per_rank is not None
        else max(args.micro_batch or 1, 4096)
    )
    try:
        found = search_max_batch_size(fits, 1, ceiling, margin)
    except BatchSizeError:
        found = None
    largest = found.best_fitting if found else None
    if args.micro_batch is not None:
        micro = args.micro_batch
        if per_rank is not None and per_rank % micro:
            raise UsageError(
                f"plan: --micro-batch {micro} does not divide the {share} {per_rank} of "
                f"--global-batch {global_batch}: {global_batch_split_message(global_batch, micro, n)}"
            )
        note = "per-device batch as given"
        if found is None or micro > found.best_fitting:
            note += " (does NOT fit by the estimate)"
    elif found is None:
        micro, note = 1, "even a per-device batch of 1 does not fit by the estimate"
    elif per_rank is None:
        micro = found.recommended
        note = f"largest per-device batch that fits: {found.best_fitting}"
        note += " (the search ceiling)" if found.hit_max_batch else ""
        note += f"; {margin:g} margin -> {found.recommended}"
    else:
        micro = per_device_batch_for_share(per_rank, found.recommended)
        if micro == per_rank:
            note = f"the whole {share} of {per_rank} fits with the {margin:g} margin"
        else:
            note = (
                f"the {share} of {per_rank} does not fit with the {margin:g} margin: "
                f"largest per-device batch that fits: {found.best_fitting}; {margin:g} margin "
                f"-> {found.recommended}; {micro} divides the share"
            )
    if per_rank is None:
        return BatchPlan(micro, 1, micro * n, largest, note)
    return BatchPlan(micro, per_rank // micro, per_rank * n, largest, note)


def learning_rate(
    subject: Subject, args: argparse.Namespace, global_batch: int
) -> dict[str, Any] | None:
    """The learning rate scaled to ``global_batch`` (None when no learning rate was given)."""
    from gpu_training.config import scale_lr

    training = subject.job.training if subject.job is not None else None
    lr = args.lr if args.lr is not None else (training.learning_rate if training else None)
    if lr is None:
        return None
    base = args.base_batch or (training.base_batch_size if training else None) or global_batch
    rule = args.lr_scaling or (training.lr_scaling if training else "linear")
    return {
        "base_lr": lr,
        "base_batch": base,
        "rule": rule,
        "global_batch": global_batch,
        "lr": scale_lr(lr, base, global_batch, rule),
    }


def _setting(value: Any) -> str:
    """A value as ``--set`` and the job file write it (YAML: ``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class Launch:
    """How to train what the plan recommends."""

    strategy: dict[str, Any]
    """The job file's ``strategy`` section."""
    commands: list[str]
    """Shell command lines: one, or one per node for a script launched with torchrun."""
    job_file: dict[str, Any] | None = None
    """For a task: the content of :data:`JOB_FILE`, which the command trains."""


def launch_commands(
    subject: Subject,
    args: argparse.Namespace,
    layout: str,
    checkpointing: bool,
    batch: BatchPlan,
    tensor_parallel: int = 1,
) -> Launch:
    """The job's ``strategy`` section and the command (per node) that trains the plan."""
    from gpu_training.launcher import multi_node_commands, single_node_command

    strategy = dict(_LAUNCH_STRATEGY[layout])
    if tensor_parallel > 1:
        strategy["tensor_parallel"] = tensor_parallel
    if checkpointing:
        strategy["activation_checkpointing"] = True
    per_node = args.gpus_per_node or min(args.gpus, 8)
    nnodes = math.ceil(args.gpus / per_node)
    if subject.job_path is None and subject.job_sections is None:  # a shape: the user's script
        if nnodes == 1:
            return Launch(strategy, [single_node_command(args.script, per_node)])
        return Launch(
            strategy,
            multi_node_commands(
                args.script, nnodes=nnodes, nproc_per_node=per_node, rdzv_endpoint=_HEAD
            ),
        )
    training: dict[str, Any] = {
        "per_device_batch_size": batch.micro,
        "global_batch_size": batch.global_batch,
    }
    # What the plan was told that the job would not otherwise know.
    for flag, name in _TRAINING_FLAGS.items():
        if getattr(args, flag) is not None:
            training[name] = getattr(args, flag)
    job_file = None
    if subject.job_path is not None:
        target = subject.job_path
        sets = [f"strategy.{k}={_setting(v)}" for k, v in strategy.items()]
        sets += [f"training.{k}={_setting(v)}" for k, v in training.items()]
    else:
        assert subject.job_sections is not None  # checked above
        target, sets = JOB_FILE, []
        job_file = {**subject.job_sections, "training": training, "strategy": strategy}
    where = ["--nproc", str(per_node)]
    if nnodes > 1:  # `launch` starts torchrun as one node of the rendezvous; run it on each
        where += ["--nnodes", str(nnodes), "--rdzv-endpoint", _HEAD]
    command = ["gpu-training", "train" if nnodes == 1 else "launch"]
    command += [target, *where] if nnodes == 1 else [*where, target]
    command += [part for text in sets for part in ("--set", text)]
    return Launch(strategy, [shlex.join(command)], job_file)
