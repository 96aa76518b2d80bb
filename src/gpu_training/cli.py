"""The ``gpu-training`` command line.

One command with subcommands. Each subcommand is a pair of functions in this module:
``_add_<name>_parser(subparsers)`` declares its flags and registers ``_run_<name>`` with
``set_defaults(_run=...)``; ``_run_<name>(args) -> int`` does the work and imports heavy
modules (torch and everything built on it) inside its body, so ``gpu-training --help`` stays
fast. To add a subcommand, write the pair and append the ``_add_*`` function to
:data:`_SUBCOMMANDS`.

Error contract: bad input (a flag, a config file, a value) prints one line
``gpu-training: error: <message>`` on stderr and exits with code 2, without a traceback.
A ``_run_*`` function reports bad input by raising :class:`UsageError` (or letting a
:class:`~gpu_training.config.ConfigError` through); any other exception is a bug and
propagates with its traceback.

Example:
    $ gpu-training config check configs/ddp.yaml --set world_size=8 --num-samples 1000000
    $ gpu-training launch-cmd --nproc 8 --nnodes 2 --rdzv-endpoint head-node:29500 train.py
    $ gpu-training ckpt verify checkpoints/        # exit 1 if a file is damaged
    $ gpu-training ckpt consolidate checkpoints/ model.safetensors
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from gpu_training import __version__

__all__ = ["PROG", "UsageError", "add_set_argument", "build_parser", "main"]

PROG = "gpu-training"
"""The command's name, as printed in messages."""

_EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user: printed as one ``gpu-training: error:`` line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        # argparse would print the whole usage block then exit; the contract is one line.
        where = self.prog.removeprefix(PROG).strip()
        context = f"{where}: " if where else ""
        raise UsageError(f"{context}{message} (see '{self.prog} --help')")


# --- config -------------------------------------------------------------------------------


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def add_set_argument(parser: argparse.ArgumentParser, example: str) -> None:
    """``--set KEY=VALUE`` (repeatable, into ``args.overrides``): every command that loads a
    config file takes its overrides the same way.

    Args:
        parser: The (sub)command's parser.
        example: An override shown in the help, e.g. ``training.max_steps=100``.
    """
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a field; VALUE is parsed as YAML (repeatable), e.g. --set {example}",
    )


def _add_config_parser(subparsers: argparse._SubParsersAction[_Parser]) -> None:
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
        type=_non_negative_int,
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


# --- launch-cmd -----------------------------------------------------------------------------


def _add_launch_cmd_parser(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    parser = subparsers.add_parser(
        "launch-cmd",
        help="print the torchrun command(s) for a launch",
        description=(
            "Print the torchrun command that launches SCRIPT, or one command per node when "
            "--nnodes > 1 (run line i on node i). Nothing is started."
        ),
    )
    parser.add_argument(
        "--nproc", type=_positive_int, required=True, metavar="N", help="processes per node"
    )
    parser.add_argument("--nnodes", type=_positive_int, default=1, metavar="M", help="nodes")
    parser.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="rendezvous host:port of the rank-0 node (needed when --nnodes > 1)",
    )
    parser.add_argument(
        "--rdzv-id", metavar="ID", help="job id shared by all nodes (default: a random one)"
    )
    parser.add_argument(
        "--max-restarts",
        type=_non_negative_int,
        metavar="K",
        help="restart the whole group up to K times when a worker fails",
    )
    parser.add_argument("script", metavar="SCRIPT", help="the training script")
    parser.add_argument(
        "script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for SCRIPT"
    )
    parser.set_defaults(_run=_run_launch_cmd)


# launcher messages name Python arguments; at the command line the user typed flags.
_LAUNCHER_FLAGS = {
    "nproc_per_node": "--nproc",
    "nproc": "--nproc",
    "nnodes": "--nnodes",
    "rdzv_endpoint": "--rdzv-endpoint",
    "rdzv_id": "--rdzv-id",
    "max_restarts": "--max-restarts",
    "script": "SCRIPT",
    "args": "ARGS",
}


def _flag_names(message: str) -> str:
    name = message.split(" ", 1)[0]
    flag = _LAUNCHER_FLAGS.get(name)
    return message if flag is None else flag + message[len(name) :]


def _run_launch_cmd(args: argparse.Namespace) -> int:
    from gpu_training.launcher import RESTART_ENV, multi_node_commands, single_node_command

    if args.nnodes > 1 and args.rdzv_endpoint is None:
        raise UsageError("launch-cmd: --nnodes > 1 needs --rdzv-endpoint HOST:PORT")
    if args.rdzv_id is not None and args.rdzv_endpoint is None:
        raise UsageError("launch-cmd: --rdzv-id needs --rdzv-endpoint HOST:PORT")
    try:
        if args.rdzv_endpoint is None:
            commands = [
                single_node_command(
                    args.script, args.nproc, args.script_args, max_restarts=args.max_restarts
                )
            ]
        else:
            commands = multi_node_commands(
                args.script,
                nnodes=args.nnodes,
                nproc_per_node=args.nproc,
                rdzv_endpoint=args.rdzv_endpoint,
                args=args.script_args,
                rdzv_id=args.rdzv_id,
                max_restarts=args.max_restarts,
            )
    except ValueError as err:
        raise UsageError(f"launch-cmd: {_flag_names(str(err))}") from None
    lines: list[str] = []
    if args.max_restarts is not None:
        # Restarts reuse the rendezvous store unless this is set: 5/12 recoveries vs 16/16.
        lines += [f"export {key}={value}" for key, value in RESTART_ENV.items()]
    if len(commands) == 1:
        lines.append(commands[0])
    else:
        for node, command in enumerate(commands):
            lines += [f"# node {node}:", command]
    print("\n".join(lines))
    return 0


# --- ckpt -------------------------------------------------------------------------------------

_EXIT_CORRUPT = 1


def _add_ckpt_parser(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    parser = subparsers.add_parser(
        "ckpt",
        help="inspect, verify, consolidate or export checkpoints",
        description=(
            "Work with checkpoint directories written by CheckpointManager (plain, sharded or "
            "DeepSpeed). DIR is a checkpoint root (its newest committed step is used) or one "
            "step-XXXXXXXX directory. A checkpoint is data: nothing in it is unpickled beyond "
            "torch's weights_only allow-list, its files never point outside it, and inspect "
            "and verify unpickle nothing at all."
        ),
    )
    actions = parser.add_subparsers(title="actions", dest="ckpt_action", metavar="ACTION")
    actions.required = True
    inspect = actions.add_parser(
        "inspect",
        help="print a checkpoint's manifest",
        description="Print the manifest of DIR's newest checkpoint (or of the step DIR names).",
    )
    inspect.add_argument("dir", metavar="DIR", help="checkpoint root or step directory")
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    inspect.set_defaults(_run=_run_ckpt_inspect)
    verify = actions.add_parser(
        "verify",
        help="check sizes and checksums (exit 1 on corruption)",
        description=(
            "Check every file of every step directory under DIR (or of the step DIR names) "
            "against its manifest: presence, size and checksum. Exit code 1 if any is damaged."
        ),
    )
    verify.add_argument("dir", metavar="DIR", help="checkpoint root or step directory")
    verify.set_defaults(_run=_run_ckpt_verify)
    consolidate = actions.add_parser(
        "consolidate",
        help="write one .safetensors or .pt file that loads into an unwrapped model",
        description=(
            "Verify DIR's newest checkpoint (or the step DIR names), sharded or plain, and "
            "write its model weights to OUT: .safetensors, or .pt/.pth (torch.save of a plain "
            "state dict, loadable with weights_only=True). Written atomically."
        ),
    )
    consolidate.add_argument("dir", metavar="DIR", help="checkpoint root or step directory")
    consolidate.add_argument("out", metavar="OUT", help="output file (.safetensors, .pt, .pth)")
    consolidate.add_argument(
        "--include-optimizer",
        action="store_true",
        help="also write the optimizer and extra state (.pt only): {model_state, ...}",
    )
    consolidate.add_argument("--force", action="store_true", help="replace OUT if it exists")
    _add_trust_argument(consolidate)
    consolidate.set_defaults(_run=_run_ckpt_consolidate)
    export = actions.add_parser(
        "export-hf",
        help="write a Hugging Face from_pretrained directory (config, safetensors, tokenizer)",
        description=(
            "Verify DIR's newest checkpoint (or the step DIR names) of a job whose model is a "
            "Hugging Face one (task hf, or a PreTrainedModel import string), any strategy, and "
            "write OUT_DIR: config.json, safetensors weights (sharded when larger than "
            "--max-shard-size) and the tokenizer files, so "
            "AutoModelForCausalLM.from_pretrained(OUT_DIR) loads it. A LoRA checkpoint is "
            "merged into its base, or written as a peft adapter with --adapter."
        ),
    )
    export.add_argument("dir", metavar="CKPT", help="checkpoint root or step directory")
    export.add_argument("out", metavar="OUT_DIR", help="directory to write (empty or new)")
    export.add_argument(
        "--adapter", action="store_true", help="LoRA: write the adapter, not the merged model"
    )
    export.add_argument(
        "--base-dir", metavar="DIR", help="LoRA: the base model (default: the job's model_dir)"
    )
    export.add_argument(
        "--max-shard-size", default="5GB", metavar="SIZE", help="largest weights file (5GB)"
    )
    export.add_argument("--force", action="store_true", help="replace OUT_DIR if not empty")
    _add_trust_argument(export)
    export.set_defaults(_run=_run_ckpt_export_hf)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _run_ckpt_inspect(args: argparse.Namespace) -> int:
    import json

    from gpu_training.checkpoint import CheckpointError, read_manifest, state_format

    try:
        step_dir, manifest = read_manifest(args.dir)
    except CheckpointError as err:
        raise UsageError(f"ckpt inspect: {err}") from None
    if args.json:
        print(json.dumps({"path": str(step_dir), "manifest": manifest}, indent=2))
        return 0
    kind = state_format(manifest)
    files = manifest["files"]
    rows = [
        ("checkpoint", str(step_dir)),
        ("step", str(manifest["step"])),
        ("format", "dcp (sharded, torch.distributed.checkpoint)" if kind == "dcp" else kind),
        ("world size", str(manifest.get("world_size", "?"))),
        ("created", str(manifest.get("created", "?"))),
        ("torch", str(manifest.get("torch_version", "?"))),
        ("config hash", str(manifest.get("config_hash") or "-")),
    ]
    if manifest.get("metadata"):
        rows.append(("metadata", json.dumps(manifest["metadata"], sort_keys=True)))
    rows.append(("files", f"{len(files)}, {_size(sum(f['size'] for f in files))}"))
    lines = [f"{name:<12} {value}" for name, value in rows]
    width = max(len(f["name"]) for f in files)
    lines += [f"  {f['name']:<{width}}  {_size(f['size']):>10}  {f['checksum']}" for f in files]
    print("\n".join(lines))
    return 0


def _run_ckpt_verify(args: argparse.Namespace) -> int:
    from gpu_training.checkpoint import CheckpointError, verify_checkpoints

    try:
        results = verify_checkpoints(args.dir)
    except CheckpointError as err:
        raise UsageError(f"ckpt verify: {err}") from None
    lines = []
    for step_dir, problems in results.items():
        if problems:
            lines.append(f"{step_dir.name}  CORRUPT")
            lines += [f"  {problem}" for problem in problems]
        else:
            lines.append(f"{step_dir.name}  OK")
    bad = sum(1 for problems in results.values() if problems)
    lines.append(f"{len(results)} checked: {len(results) - bad} OK, {bad} corrupt")
    print("\n".join(lines))
    return _EXIT_CORRUPT if bad else 0


def _run_ckpt_consolidate(args: argparse.Namespace) -> int:
    from gpu_training.checkpoint import CheckpointError, consolidate, read_manifest

    try:
        step_dir, _ = read_manifest(args.dir)
        out = consolidate(
            step_dir,
            args.out,
            include_optimizer=args.include_optimizer,
            overwrite=args.force,
            trusted=args.trust_checkpoint,
        )
    except (CheckpointError, ValueError) as err:
        raise UsageError(f"ckpt consolidate: {err}") from None
    except ImportError as err:
        raise UsageError(f"ckpt consolidate: {err} (pip install safetensors)") from None
    print(f"wrote {out} ({_size(out.stat().st_size)}) from {step_dir}")
    return 0


def _run_ckpt_export_hf(args: argparse.Namespace) -> int:
    from gpu_training.checkpoint import CheckpointError, read_manifest

    try:
        step_dir, _ = read_manifest(args.dir)
        from gpu_training.checkpoint.export_hf import export_hf  # imports transformers

        out = export_hf(
            step_dir,
            args.out,
            adapter=args.adapter,
            base_dir=args.base_dir,
            max_shard_size=args.max_shard_size,
            overwrite=args.force,
            trusted=args.trust_checkpoint,
        )
    except (CheckpointError, ValueError) as err:
        raise UsageError(f"ckpt export-hf: {' '.join(str(err).split())}") from None
    except ImportError as err:
        raise UsageError(f"ckpt export-hf: {err} (pip install 'gpu-training[hf]')") from None
    files = sorted(p.name for p in out.iterdir())
    print(f"wrote {out} from {step_dir}: {', '.join(files)}")
    return 0


# --- the command ------------------------------------------------------------------------------

# --- train ---------------------------------------------------------------------------------


_ALLOW_CHANGE_ENV = "GPU_TRAINING_ALLOW_CONFIG_CHANGE"
_TRUST_ENV = "GPU_TRAINING_TRUST_CHECKPOINT"


def _add_train_parser(subparsers: argparse._SubParsersAction[_Parser]) -> None:
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
        type=_positive_int,
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
        type=_positive_int,
        metavar="S",
        help="end the run after S seconds without a step, naming the stalled rank and "
        "dumping every rank's stack (default: no watchdog)",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume from a checkpoint written with other math-relevant settings (learning "
        "rate, model shape, batch...); without it such a resume is refused, naming them",
    )
    _add_trust_argument(parser)
    parser.set_defaults(_run=_run_train)


def _add_trust_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="let DeepSpeed's checkpoint readers unpickle files that hold objects outside "
        "the weights_only allow-list: this can run code from the checkpoint; only for "
        "checkpoints from a source you trust",
    )


def _env_flag(name: str) -> bool:
    import os

    return os.environ.get(name) == "1"


def _bad_input_exits(fit: Callable[[], dict[str, float]]) -> Callable[[], dict[str, float]]:
    """In a rank: bad input found there is one line from rank 0 and exit 2 on every rank.

    The Trainer's checks that need the ranks (a resume refused, a user task's data too
    small) and a checkpoint the file system refuses (a full disk, a permission: a
    CheckpointError caused by an OSError) fail alike on every rank: a traceback from each
    would bury the one line. Any other error keeps its traceback, for torchrun's report.
    """
    import os

    from gpu_training.checkpoint import CheckpointError
    from gpu_training.config import ConfigError
    from gpu_training.launcher.torchrun import QUIET_ENV

    def bad_input(err: BaseException) -> bool:
        if isinstance(err, ConfigError):
            return True
        # a checkpoint the environment refused (full disk, permissions); not a bug of the
        # user's code that surfaced while saving (that keeps its traceback)
        cause: BaseException | None = err
        for _ in range(8):
            if cause is None:
                return False
            if isinstance(cause, OSError):
                return True
            cause = cause.__cause__ or cause.__context__
        return False

    def run() -> dict[str, float]:
        try:
            return fit()
        except (ConfigError, CheckpointError) as err:
            if not bad_input(err):
                raise
            # under train --nproc the launcher prints the line, from the root cause's record
            if os.environ.get("RANK", "0") == "0" and not os.environ.get(QUIET_ENV):
                print(f"{PROG}: error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
            raise SystemExit(_EXIT_USAGE) from None

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

    from gpu_training.launcher import QUIET_TORCHRUN, launch_argv, launch_env, run_torchrun

    train_args = ["train", args.config]
    for text in args.overrides:
        train_args += ["--set", text]
    argv = launch_argv("gpu_training", args.nproc, train_args, module=True, program=QUIET_TORCHRUN)
    # forwards the stop signals to the workers (they save; exit 143), reaps orphans, no /tmp litter
    return run_torchrun(argv, launch_env(os.environ, nproc_per_node=args.nproc))


def _run_train(args: argparse.Namespace) -> int:
    import os

    from gpu_training.job import load_job

    # Through the environment: torchrun's workers inherit it (and a relaunch keeps it).
    if args.debug:
        os.environ["GPU_TRAINING_DEBUG"] = "1"
    if args.stall_timeout:
        os.environ["GPU_TRAINING_STALL_TIMEOUT"] = str(args.stall_timeout)
    if args.allow_config_change:
        os.environ[_ALLOW_CHANGE_ENV] = "1"
    if args.trust_checkpoint:
        os.environ[_TRUST_ENV] = "1"

    job = load_job(args.config, list(args.overrides))
    if not _under_launcher():
        _validate_job(job, args)
    if args.nproc > 1 and not _under_launcher():
        return _launch_workers(args)
    from gpu_training.diagnostics.watchdog import entry_point
    from gpu_training.failure import end_failed_rank
    from gpu_training.preemption import EXIT_PREEMPTED
    from gpu_training.trainer import Trainer

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
            end_failed_rank(exc)  # no interpreter shutdown: gloo can hang in it (DESIGN.md)
        raise
    if summary["preempted"]:
        return EXIT_PREEMPTED
    return 0


_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction[_Parser]], None], ...] = (
    _add_train_parser,
    _add_config_parser,
    _add_launch_cmd_parser,
    _add_ckpt_parser,
)

_COMMAND_MODULES: tuple[str, ...] = ("launch", "plan", "find_batch", "monitor", "diagnostics")
"""Modules under ``gpu_training.commands`` that add subcommands of their own.

Each one defines ``register(subparsers) -> None`` (same contract as the ``_add_*``
functions here) and imports nothing heavy at module level, so ``--help`` stays fast.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``gpu-training`` argument parser with every subcommand registered.

    Returns:
        A parser whose errors raise :class:`UsageError` instead of exiting.
    """
    parser = _Parser(
        prog=PROG,
        description=(
            "Take a PyTorch training job from one GPU to many: check configs, build launch "
            "commands, inspect and consolidate checkpoints."
        ),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(subparsers)
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(f"gpu_training.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gpu-training`` with ``argv`` (default: ``sys.argv[1:]``).

    Args:
        argv: Command-line arguments, without the program name.

    Returns:
        The exit code: 0 on success, 2 on bad input (after one ``gpu-training: error:``
        line on stderr).

    Raises:
        Exception: Anything that is not bad input (a bug) propagates with its traceback.

    Example:
        >>> main(["launch-cmd", "--nproc", "4", "train.py"])
        torchrun --standalone --nproc_per_node=4 train.py
        0
    """
    from gpu_training.config import ConfigError

    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help / --version: argparse printed and wants to exit
            return exc.code if isinstance(exc.code, int) else 0
        run: Callable[[argparse.Namespace], int] | None = getattr(args, "_run", None)
        if run is None:
            raise UsageError(f"no command given (see '{PROG} --help')")
        return run(args)
    except (UsageError, ConfigError) as err:
        # One line, whatever the message carried (a YAML error can span several).
        message = " ".join(str(err).split())
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return _EXIT_USAGE
