"""What ``gpu-training plan`` and ``gpu-training find-batch`` both read from the user.

Argument types for their flags (:func:`parse_size` for GPU memory and overheads,
:func:`parse_margin` for the safety margin and MFU, :func:`parse_positive_float` for learning
rates and peak TFLOP/s, :func:`bounded_float` for prices, :func:`parse_bandwidth` for link
bandwidths, :func:`bounded_int` for counts, batches and shape dimensions) and
:func:`batch_factory`, which turns a task's training set into the ``make_batch(n)`` that the
memory profiler and the batch-size finder call. Every type rejects what cannot mean anything
(zero, negative, ``inf``, ``nan``, ``1e400``) and what is too large to be a real machine or
model (the ``MAX_*`` bounds, named in the message), so the command answers with one line
instead of an overflow deep inside the estimate. Private to :mod:`gpu_training.commands`;
:func:`parse_size` is public as ``gpu_training.commands.plan.parse_size``. No torch import at
module level.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "MAX_BANDWIDTH",
    "MAX_BATCH",
    "MAX_DIMENSION",
    "MAX_GPUS",
    "MAX_SIZE",
    "batch_factory",
    "bounded_float",
    "bounded_int",
    "parse_bandwidth",
    "parse_margin",
    "parse_number",
    "parse_positive_float",
    "parse_size",
]

MAX_SIZE = 2**50
"""Largest memory size a flag takes: 1 PiB per GPU (today's GPUs hold under 200 GiB)."""

MAX_GPUS = 2**20
"""Most GPUs a plan considers (the strategy chooser's own search stops there too)."""

MAX_BATCH = 2**24
"""Largest batch (global, per device, or a search bound) a flag takes: 16,777,216 samples."""

MAX_DIMENSION = 2**24
"""Largest transformer dimension (layers, hidden, heads, sequence, vocabulary, MLP width):
beyond it the reference model's tensors overflow what torch can describe."""

MAX_BANDWIDTH = 1e5
"""Fastest link a flag takes, GB/s: 100 TB/s per GPU (NVLink 5 is 1.8 TB/s both ways)."""

_NUMBER = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*")

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
    "p": 2**50,
    "pb": 2**50,
    "pib": 2**50,
}


def parse_number(text: str, scales: Mapping[str, int]) -> int | None:
    """The integer that ``<number><suffix>`` stands for, or None if it stands for none.

    The suffix is looked up (case-insensitive) in ``scales``; ``""`` is the bare number's
    scale. None for text that is not a number, an unknown suffix, and a value that overflows
    a float (``1e400``): the caller says what it expected.

    Example:
        >>> parse_number("1.5k", {"": 1, "k": 1000}), parse_number("1e400", {"": 1})
        (1500, None)
    """
    match = _NUMBER.fullmatch(text)
    suffix = match.group(2).lower() if match else ""
    if match is None or suffix not in scales:
        return None
    value = float(match.group(1)) * scales[suffix]
    return round(value) if math.isfinite(value) else None


def parse_size(text: str) -> int:
    """Bytes from ``80``, ``80GB``, ``80GiB``, ``81920MiB``, ``1.5T`` (a bare number is GiB).

    GB and GiB both mean 2³⁰ bytes here, as GPU names use them ("A100 80GB" holds 80 GiB).

    Raises:
        argparse.ArgumentTypeError: For anything else: zero or negative sizes, less than a
            byte, ``inf``/``nan``/``1e400``, or more than :data:`MAX_SIZE` (1 PiB).

    Example:
        >>> parse_size("80") == parse_size("80GB") == 80 * 2**30, parse_size("500MiB")
        (True, 524288000)
    """
    value = parse_number(text, _UNITS)
    if value is None or not 1 <= value <= MAX_SIZE:
        raise argparse.ArgumentTypeError(
            f"expected a positive size up to 1PiB, such as 80, 80GB or 40960MiB, got {text!r}"
        )
    return value


def bounded_int(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``minimum`` to ``maximum``, both included.

    Example:
        >>> bounded_int(1, MAX_GPUS)("8")
        8
        >>> bounded_int(1, 64)("65")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected an integer from 1 to 64, got '65'
    """

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:  # also a 5,000-digit number: int() refuses to read it
            value = None
        if value is None or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"expected an integer from {minimum} to {maximum}, got {text!r}"
            )
        return value

    return parse


def parse_margin(text: str) -> float:
    """A safety margin in (0, 1], e.g. ``0.85``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:  # nan fails too
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def parse_positive_float(text: str) -> float:
    """A finite number > 0, e.g. a learning rate or a peak TFLOP/s."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def bounded_float(maximum: float, what: str = "a number") -> Callable[[str], float]:
    """An argparse type: a finite number > 0 and <= ``maximum``; ``what`` names it in the error.

    Example:
        >>> bounded_float(1e4, "a price in dollars")("2.49")
        2.49
        >>> bounded_float(1e4, "a price in dollars")("1e400")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected a price in dollars > 0 and <= 10000, got '1e400'
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= maximum):
            raise argparse.ArgumentTypeError(
                f"expected {what} > 0 and <= {maximum:g}, got {text!r}"
            )
        return value

    return parse


_BANDWIDTH = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]*)\s*")
# Case matters: GB/s are bytes, Gb/s bits (network links are sold in Gb/s).
_BANDWIDTH_SCALE = {
    "": 1.0,
    "GB/s": 1.0,
    "GBps": 1.0,
    "TB/s": 1e3,
    "Gb/s": 1 / 8,
    "Gbps": 1 / 8,
    "Gbit/s": 1 / 8,
    "Tb/s": 125.0,
}


def parse_bandwidth(text: str) -> float:
    """GB/s (10⁹ bytes per second) from ``450``, ``450GB/s``, ``1.8TB/s``, ``400Gb/s``, ``400Gbps``.

    A bare number is GB/s; ``Gb/s``/``Gbps`` are bits (a 400 Gb/s NIC moves 50 GB/s).

    Raises:
        argparse.ArgumentTypeError: For anything else: zero, negative, ``inf``/``nan``/
            ``1e400``, an unknown unit, or more than :data:`MAX_BANDWIDTH`.

    Example:
        >>> parse_bandwidth("450"), parse_bandwidth("400Gb/s"), parse_bandwidth("1.8TB/s")
        (450.0, 50.0, 1800.0)
    """
    match = _BANDWIDTH.fullmatch(text)
    scale = _BANDWIDTH_SCALE.get(match.group(2)) if match else None
    value = float(match.group(1)) * scale if match and scale is not None else math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_BANDWIDTH):
        raise argparse.ArgumentTypeError(
            "expected a bandwidth > 0 and <= 100TB/s, such as 450 (GB/s), 450GB/s or "
            f"400Gb/s, got {text!r}"
        )
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
