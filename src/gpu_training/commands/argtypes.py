"""The argparse types and shared flags of the subcommands: one place, one wording.

Each type raises ``argparse.ArgumentTypeError`` with what was expected; the CLI's parser turns
it into the one-line ``gpu-training: error: ...`` of the error contract (exit 2).

Example:
    >>> positive_int("3")
    3
"""

from __future__ import annotations

import argparse

__all__ = [
    "add_set_argument",
    "add_trust_argument",
    "non_negative_int",
    "positive_int",
    "refresh_seconds",
]


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0, or one line saying what was expected."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1, or one line saying what was expected."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def refresh_seconds(text: str) -> float:
    """Seconds between refreshes of a live view: > 0 and at most a day (nan and inf refused)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 86_400:  # nan and inf fail too: a refresh that never comes is a hang
        raise argparse.ArgumentTypeError(f"expected seconds > 0 and at most 86400, got {text!r}")
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


def add_trust_argument(parser: argparse.ArgumentParser) -> None:
    """``--trust-checkpoint``: the one way around the checkpoint readers' allow-lists."""
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="let DeepSpeed's checkpoint readers unpickle files that hold objects outside "
        "the weights_only allow-list: this can run code from the checkpoint; only for "
        "checkpoints from a source you trust",
    )
