"""What ``gpu-training plan`` and ``gpu-training find-batch`` both read from the user.

Argument types for their flags (:func:`parse_size` for GPU memory and overheads,
:func:`parse_margin` for the safety margin, :func:`parse_positive_float` for learning rates
and peak TFLOP/s) and :func:`batch_factory`, which turns a task's training set into the
``make_batch(n)`` that the memory profiler and the batch-size finder call. Private to
:mod:`gpu_training.commands`; :func:`parse_size` is public as
``gpu_training.commands.plan.parse_size``. No torch import at module level.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["batch_factory", "parse_margin", "parse_positive_float", "parse_size"]

_UNITS = {
    "": 2**30,  # a bare number is GiB: GPUs are sold as "80GB" and hold ~80 GiB
    "b": 1,
    "k": 2**10,
    "kb": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mb": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gb": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tb": 2**40,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """Bytes from ``80``, ``80GB``, ``80GiB``, ``81920MiB``, ``1.5T`` (a bare number is GiB).

    GB and GiB both mean 2³⁰ bytes here, as GPU names use them ("A100 80GB" holds 80 GiB).

    Raises:
        argparse.ArgumentTypeError: For anything else, zero or negative sizes included.

    Example:
        >>> parse_size("80") == parse_size("80GB") == 80 * 2**30, parse_size("500MiB")
        (True, 524288000)
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a positive size such as 80, 80GB or 40960MiB, got {text!r}"
        )
    return round(float(match.group(1)) * _UNITS[unit])


def parse_margin(text: str) -> float:
    """A safety margin in (0, 1], e.g. ``0.85``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def parse_positive_float(text: str) -> float:
    """A number > 0, e.g. a learning rate or a peak TFLOP/s."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def batch_factory(dataset: Any, command: str) -> Callable[[int], Sequence[Any]]:
    """``make_batch(n)``: the first ``n`` samples of ``dataset`` (cycled), collated.

    ``command`` (``plan``, ``find-batch``) prefixes the error for an empty dataset.
    """
    from torch.utils.data import default_collate

    size = len(dataset)
    if size == 0:
        from gpu_training.cli import UsageError

        raise UsageError(f"{command}: the task's training set is empty: nothing to measure")

    def make_batch(n: int) -> Sequence[Any]:
        return list(default_collate([dataset[i % size] for i in range(n)]))

    return make_batch
