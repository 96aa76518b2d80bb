"""``gpu-training train``: check everything that needs no process, start torchrun, run the Trainer.

On the launching host :mod:`gpu_training.preflight` checks the job first; with ``--nproc N``
outside torchrun, torchrun's agent runs in this process
(:func:`gpu_training.launcher.torchrun.run_here`); inside a
rank the Trainer runs under :func:`~gpu_training.watchdog.entry_point`, bad input
found there is one line and exit 2, and a failed rank ends at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from gpu_training.cli import EXIT_USAGE, PROG
from gpu_training.commands.argtypes import (
    add_set_argument,
    add_trust_argument,
    positive_int,
)

__all__ = ["register"]


_ALLOW_CHANGE_ENV = "GPU_TRAINING_ALLOW_CONFIG_CHANGE"
_TRUST_ENV = "GPU_TRAINING_TRUST_CHECKPOINT"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "train",
        help="run a training job (the built-in example, or your model and data)",
        description=(
            "Train the job described by CONFIG (task, training, strategy, checkpoint, run "
            "sections). With --nproc N > 1 outside torchrun, torchrun is started for you; "
            "a run resumes from its newest complete checkpoint. Everything that can be "
            "checked before a process starts is checked first (task options, the batch "
            "split for --nproc, writable directories, the checkpoint to resume). "
            "Trust: a job file is code, like a training script: its import strings "
            "(task.model, task.data, task.loss, a task factory) are imported and called, "
            "so run only job files you trust. A checkpoint is data: nothing in it is "
            "unpickled beyond torch's weights_only allow-list unless --trust-checkpoint."
        ),
    )
    parser.add_argument(
        "config",
        metavar="CONFIG",
        help="a job file (.yaml or .json); it is code: its import strings are imported and run",
    )
    parser.add_argument(
        "--nproc",
        type=positive_int,
        default=1,
        metavar="N",
        help="processes on this machine (one per GPU; CPU processes use gloo)",
    )
    add_set_argument(parser, "training.max_steps=100")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="check that every rank calls the same collectives (TORCH_DISTRIBUTED_DEBUG="
        "DETAIL, slower): a mismatch fails in seconds, naming both ranks and both "
        "operations, instead of hanging",
    )
    parser.add_argument(
        "--stall-timeout",
        type=positive_int,
        metavar="S",
        help="end the run after S seconds without a step, naming the stalled rank and "
        "dumping every rank's stack (sets run.stall_timeout; default: no watchdog)",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume from a checkpoint written with other math-relevant settings (learning "
        "rate, model shape, batch...); without it such a resume is refused, naming them",
    )
    add_trust_argument(parser)
    parser.set_defaults(_run=_run_train)


def _env_flag(name: str) -> bool:
    import os

    return os.environ.get(name) == "1"


def _bad_input_exits(fit: Callable[[], dict[str, float]]) -> Callable[[], dict[str, float]]:
    """In a rank: bad input found there is one line from rank 0 and exit 2 on every rank;
    a run stopped at ``training.max_nonfinite_steps`` (:class:`NonFiniteError`, raised on
    every rank at the same step) is one line and exit 3.

    The Trainer's checks that need the ranks (a resume refused, a user task's data too
    small) and a checkpoint the file system refuses (a full disk, a permission: a
    CheckpointError caused by an OSError) fail alike on every rank: a traceback from each
    would bury the one line. Any other error keeps its traceback, for torchrun's report.
    """
    import os

    from gpu_training.checkpoint import CheckpointError, refused_by_environment
    from gpu_training.config import ConfigError
    from gpu_training.failure import exit_now, record_failure
    from gpu_training.launcher.torchrun import EXIT_NONFINITE, QUIET_ENV
    from gpu_training.nonfinite import NonFiniteError

    def bad_input(err: BaseException) -> bool:
        # a checkpoint the environment refused (full disk, permissions, on this rank or on
        # rank 0, relayed); not a bug of the user's code that surfaced while saving (that
        # keeps its traceback)
        return isinstance(err, ConfigError) or refused_by_environment(err)

    def say(err: BaseException) -> None:
        # under train --nproc the launcher prints the line, from the root cause's record
        if os.environ.get("RANK", "0") == "0" and not os.environ.get(QUIET_ENV):
            print(f"{PROG}: error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)

    def one_line(err: BaseException, code: int) -> NoReturn:
        say(err)
        raise SystemExit(code) from None

    def run() -> dict[str, float]:
        try:
            return fit()
        except (ConfigError, CheckpointError) as err:
            if not bad_input(err):
                raise
            one_line(err, EXIT_USAGE)
        except NonFiniteError as err:  # every rank stops at the same step: no traceback
            if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
                # mid-run, gloo's threads are alive: interpreter shutdown can abort in them
                # (docs/design.md, "Traps"), so the rank ends at once, its record written
                record_failure(err)
                say(err)
                exit_now(EXIT_NONFINITE)
            one_line(err, EXIT_NONFINITE)

    return run


def _under_launcher() -> bool:
    import os

    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def _validate_job(job: Any, args: argparse.Namespace) -> None:
    """Every check that needs no process, before torchrun starts or a file is written."""
    from gpu_training.preflight import check_launch

    # warnings (settings changed that do not change the math) are printed by rank 0
    check_launch(
        job,
        args.nproc,
        allow_config_change=args.allow_config_change,
        trust_checkpoint=args.trust_checkpoint,
    )


def _launch_workers(args: argparse.Namespace) -> int:
    import os

    from gpu_training.launcher import launch_argv, launch_env
    from gpu_training.launcher.torchrun import run_here

    train_args = ["train", args.config]
    for text in args.overrides:
        train_args += ["--set", text]
    argv = launch_argv("gpu_training", args.nproc, train_args, module=True, program=())
    # torchrun's agent runs here: torch is imported already (the checks above need it), and a
    # torchrun child would be one more interpreter and torch import. Signals reach the workers
    # (they save; exit 143); if this process is killed, a janitor stops them. No restarts: the
    # workers use the agent's store (no second port to race for, launch_env).
    return run_here(argv, launch_env(os.environ, nproc_per_node=args.nproc, restarts=False))


def _run_train(args: argparse.Namespace) -> int:
    import os

    from gpu_training.job import load_job

    # Through the environment: torchrun's workers inherit it (and a relaunch keeps it).
    if args.debug:
        os.environ["GPU_TRAINING_DEBUG"] = "1"
    if args.stall_timeout:  # a job field: an override, so torchrun's workers get it too
        args.overrides = [*args.overrides, f"run.stall_timeout={args.stall_timeout}"]
    if args.allow_config_change:
        os.environ[_ALLOW_CHANGE_ENV] = "1"
    if args.trust_checkpoint:
        os.environ[_TRUST_ENV] = "1"

    job = load_job(args.config, list(args.overrides))
    if not _under_launcher():
        _validate_job(job, args)
    if args.nproc > 1 and not _under_launcher():
        return _launch_workers(args)
    from gpu_training.failure import end_failed_rank
    from gpu_training.preemption import EXIT_PREEMPTED
    from gpu_training.trainer import Trainer
    from gpu_training.watchdog import entry_point

    # the rank that raised, with its traceback, is what torchrun reports
    trainer = Trainer(
        job,
        allow_config_change=args.allow_config_change or _env_flag(_ALLOW_CHANGE_ENV),
        trust_checkpoint=args.trust_checkpoint or _env_flag(_TRUST_ENV),
    )
    try:
        summary = entry_point(_bad_input_exits(trainer.fit))()
    except (Exception, KeyboardInterrupt) as exc:
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            end_failed_rank(
                exc
            )  # no interpreter shutdown: gloo can hang in it (docs/design.md, "Traps")
        raise
    if summary["preempted"]:
        return EXIT_PREEMPTED
    return 0
