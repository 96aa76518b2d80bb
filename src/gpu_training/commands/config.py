"""``gpu-training config check``: a training config or a job file, validated and explained.

Nothing is imported or run: ``train`` checks the task itself.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpu_training.cli import UsageError
from gpu_training.commands.argtypes import (
    add_set_argument,
    non_negative_int,
)

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "config",
        help="check a training config",
        description="Work with training config files (YAML or JSON).",
    )
    actions = parser.add_subparsers(title="actions", dest="config_action", metavar="ACTION")
    actions.required = True
    check = actions.add_parser(
        "check",
        help="validate a config or job file and print its batch and learning-rate arithmetic",
        description=(
            "Load CONFIG, apply --set overrides, validate every field and print the effective "
            "batch (per device x accumulation x ranks) and the learning rate it implies. "
            "CONFIG is a training config (TrainingConfig fields at the top level) or a job "
            "file for 'gpu-training train' (task, training, strategy, checkpoint, run "
            "sections; --set takes section.field there, e.g. training.world_size=8). Nothing "
            "is imported or run: 'train' checks the task itself."
        ),
    )
    check.add_argument("config", metavar="CONFIG", help="a .yaml, .yml or .json config or job file")
    add_set_argument(check, "world_size=8 (a job file: training.world_size=8)")
    check.add_argument(
        "--num-samples",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="training-set size, to report optimizer steps per epoch",
    )
    check.set_defaults(_run=_run_config_check)


_JOB_SECTIONS = frozenset({"task", "task_options", "training", "strategy", "checkpoint", "run"})
_DEEPSPEED_KEYS = frozenset(
    {"train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization"}
)


def _run_config_check(args: argparse.Namespace) -> int:
    from gpu_training.config import ConfigError, load_config, parse_override, read_config_file

    data = read_config_file(args.config)
    if _JOB_SECTIONS & set(data):
        return _check_job_file(args)
    if _DEEPSPEED_KEYS & set(data):  # its first key would be "unknown field 'train_batch_size'"
        raise UsageError(
            f"config check: {args.config} is a DeepSpeed config, not a training config or job "
            "file: name it as strategy.deepspeed_config in a job file (see "
            "configs/deepspeed_job.yaml) and check that"
        )
    try:
        overrides = dict(parse_override(text) for text in args.overrides)
    except ConfigError as err:
        raise UsageError(f"--set: {err}") from None
    cfg = load_config(args.config, overrides=overrides)
    print(cfg.describe(num_samples=args.num_samples))
    return 0


def _check_job_file(args: argparse.Namespace) -> int:
    from gpu_training.job import load_job

    job = load_job(args.config, list(args.overrides))
    task = job.task
    if task.name is not None:
        options = ", ".join(f"{k}={v}" for k, v in sorted(task.options.items()))
        what = task.name + (f" ({options})" if options else "")
    else:
        what = f"model {task.model}, data {task.data}" + (
            f", loss {task.loss}" if task.loss else ""
        )
    lines = [
        f"job: {args.config}",
        f"task: {what}",
        job.training.describe(num_samples=args.num_samples),
        f"strategy: {job.strategy.name}",
        f"checkpoints: {job.checkpoint_dir} (every {job.checkpoint.every}, keep "
        f"{job.checkpoint.keep_last_n})",
        f"outputs: {job.run.output_dir}",
    ]
    print("\n".join(lines))
    return 0
