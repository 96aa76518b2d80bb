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
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from gpu_training import __version__

__all__ = ["PROG", "UsageError", "build_parser", "main"]

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
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


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
        help="validate a config and print its batch and learning-rate arithmetic",
        description=(
            "Load CONFIG, apply --set overrides, validate every field and print the effective "
            "batch (per device x accumulation x ranks) and the learning rate it implies."
        ),
    )
    check.add_argument("config", metavar="CONFIG", help="a .yaml, .yml or .json config file")
    check.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field; VALUE is parsed as YAML (repeatable), e.g. --set world_size=8",
    )
    check.add_argument(
        "--num-samples",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="training-set size, to report optimizer steps per epoch",
    )
    check.set_defaults(_run=_run_config_check)


def _run_config_check(args: argparse.Namespace) -> int:
    from gpu_training.config import ConfigError, load_config, parse_override

    try:
        overrides = dict(parse_override(text) for text in args.overrides)
    except ConfigError as err:
        raise UsageError(f"--set: {err}") from None
    cfg = load_config(args.config, overrides=overrides)
    print(cfg.describe(num_samples=args.num_samples))
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


# --- the command ------------------------------------------------------------------------------

_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction[_Parser]], None], ...] = (
    _add_config_parser,
    _add_launch_cmd_parser,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``gpu-training`` argument parser with every subcommand registered.

    Returns:
        A parser whose errors raise :class:`UsageError` instead of exiting.
    """
    parser = _Parser(
        prog=PROG,
        description=(
            "Take a PyTorch training job from one GPU to many: check configs, build launch "
            "commands."
        ),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(subparsers)
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
