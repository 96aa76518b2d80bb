"""Checks of user-given values, each failing with one line that names the value.

Two families, by the wording their callers have always shown:

- Config fields (:class:`ConfigError`, ``field 'x': expected ...``): :func:`check_int`,
  :func:`check_optional_int`, :func:`check_float`, :func:`check_choice`. The config
  dataclasses (:class:`~gpu_training.config.TrainingConfig`, the job's sections) use them.
- Function arguments (``x must be ...``, a ``ValueError`` unless the caller names its own
  error class): :func:`check_int_argument` and :func:`check_positive_int_argument`.

``bool`` is an ``int`` subclass: every integer check refuses it, so ``true`` in a YAML file
or ``nproc=True`` never passes as 1. No torch import.
"""

from __future__ import annotations

import difflib
import math

__all__ = [
    "ConfigError",
    "check_choice",
    "check_float",
    "check_int",
    "check_int_argument",
    "check_optional_int",
    "check_positive_int_argument",
]


class ConfigError(ValueError):
    """A configuration value is missing, mistyped or out of range.

    The message is one line that names the field (and the file, when loaded from one) and
    what is expected, so a command-line tool can print it as is.

    Attributes:
        field: The offending field name (``None`` when the whole document is wrong).
    """

    # Its public home: tracebacks, doctests and the docs name it gpu_training.config.ConfigError.
    __module__ = "gpu_training.config"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


# --- config fields ---------------------------------------------------------------------------


def _describe_value(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_int(name: str, value: object, minimum: int) -> None:
    """Field ``name`` is an integer (not a bool) of at least ``minimum``.

    Raises:
        ConfigError: ``field 'name': expected an integer >= minimum, got ...``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"field '{name}': expected an integer >= {minimum}, got {_describe_value(value)}", name
        )
    if value < minimum:
        raise ConfigError(f"field '{name}': expected an integer >= {minimum}, got {value}", name)


def check_optional_int(name: str, value: object, minimum: int) -> None:
    """:func:`check_int`, with ``None`` allowed."""
    if value is not None:
        check_int(name, value, minimum)


def check_float(name: str, value: object, *, minimum: float, strict: bool) -> None:
    """Field ``name`` is a finite number above (``strict``) or at least ``minimum``.

    Raises:
        ConfigError: Naming the field, what is expected and the value.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"field '{name}': expected a number, got {_describe_value(value)}", name)
    if not math.isfinite(float(value)):
        raise ConfigError(f"field '{name}': expected a finite number, got {value}", name)
    bad = value <= minimum if strict else value < minimum
    if bad:
        op = ">" if strict else ">="
        raise ConfigError(f"field '{name}': expected a number {op} {minimum}, got {value}", name)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """Field ``name`` is one of ``choices``.

    Raises:
        ConfigError: Listing the choices, with the closest one for a near miss.
    """
    if not isinstance(value, str) or value not in choices:
        hint = ""
        if isinstance(value, str):
            close = difflib.get_close_matches(value, choices, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(
            f"field '{name}': expected one of {', '.join(choices)}, got {_describe_value(value)}"
            f"{hint}",
            name,
        )


# --- function arguments ----------------------------------------------------------------------


def check_int_argument(
    name: str, value: object, minimum: int = 1, *, error: type[Exception] = ValueError
) -> int:
    """``value``, when it is an integer (not a bool) of at least ``minimum``.

    Example:
        >>> check_int_argument("nodes", 2)
        2
        >>> check_int_argument("nodes", True)
        Traceback (most recent call last):
        ...
        ValueError: nodes must be an integer >= 1, got True

    Raises:
        ValueError: Or ``error``: ``name must be an integer >= minimum, got value``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise error(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_positive_int_argument(
    name: str, value: object, *, error: type[Exception] = ValueError
) -> int:
    """``value``, when it is an integer (not a bool) of at least 1.

    Example:
        >>> check_positive_int_argument("world_size", 0)
        Traceback (most recent call last):
        ...
        ValueError: world_size must be a positive integer, got 0

    Raises:
        ValueError: Or ``error``: ``name must be a positive integer, got value``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{name} must be a positive integer, got {value!r}")
    return value
