"""The ``gpu-training`` command line: the parser, the error contract, the registry.

Every subcommand lives in a module of :mod:`gpu_training.commands` (``train``, ``config``,
``launch`` with ``launch-cmd``, ``ckpt``, ``plan``, ``find_batch``, ``monitor``,
``diagnostics``) that defines ``register(subparsers)``: it declares its flags (argparse types
in :mod:`gpu_training.commands.argtypes`) and sets ``_run`` to a function ``(args) -> int``
that imports heavy modules (torch and everything built on it) inside its body, so
``gpu-training --help`` stays fast. To add a subcommand, write such a module and append it
to :data:`_COMMAND_MODULES`.

Error contract: bad input (a flag, a config file, a value) prints one line
``gpu-training: error: <message>`` on stderr and exits with code 2, without a traceback.
A runner reports bad input by raising :class:`UsageError` (or letting a
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
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from gpu_training import __version__
from gpu_training.commands.argtypes import add_set_argument

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_USAGE",
    "PROG",
    "UsageError",
    "add_set_argument",
    "build_parser",
    "main",
]

PROG = "gpu-training"
"""The command's name, as printed in messages."""

EXIT_USAGE = 2
"""The exit code of bad input (a flag, a config field, a file)."""

EXIT_BROKEN_PIPE = 128 + 13
"""The exit code when the reader of the output went away (SIGPIPE's, as a shell reports it)."""


class UsageError(Exception):
    """Bad input from the user: printed as one ``gpu-training: error:`` line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        # argparse would print the whole usage block then exit; the contract is one line.
        where = self.prog.removeprefix(PROG).strip()
        context = f"{where}: " if where else ""
        raise UsageError(f"{context}{message} (see '{self.prog} --help')")


_COMMAND_MODULES: tuple[str, ...] = (
    "train",
    "config",
    "launch",
    "ckpt",
    "plan",
    "find_batch",
    "monitor",
    "report",
    "watch",
    "diagnostics",
)
"""The modules under ``gpu_training.commands``, in ``--help`` order; each defines
``register(subparsers) -> None`` and imports nothing heavy at module level."""


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
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader left (`gpu-training lint --explain GT019 | head`): stop quietly, as `cat`
        # does, and keep the interpreter's last flush of stdout from failing again at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
