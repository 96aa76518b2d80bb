"""Training configuration: the effective batch, learning-rate scaling, and validated loading.

A distributed job is defined by the batch the optimizer sees, not by the per-GPU batch::

    effective_batch = per_device_batch_size × gradient_accumulation_steps × world_size

:class:`TrainingConfig` keeps that number explicit, scales the learning rate when it moves
away from the batch the LR was tuned at, and checks itself on construction so that a typo in
a YAML file is one clear line instead of a silent default. This module imports no torch:
``gpu-training`` can read and check a config in a fraction of a second.

Example:
    >>> from gpu_training.config import TrainingConfig, gradient_accumulation_for_target
    >>> accum = gradient_accumulation_for_target(512, per_device_batch_size=8, world_size=4)
    >>> cfg = TrainingConfig(per_device_batch_size=8, gradient_accumulation_steps=accum,
    ...                      world_size=4)
    >>> cfg.effective_batch_size
    512
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

__all__ = [
    "LR_SCALING_RULES",
    "PRECISIONS",
    "AccumulationPlan",
    "ConfigError",
    "TrainingConfig",
    "accumulation_plan",
    "global_batch_plan",
    "global_batch_split_message",
    "gradient_accumulation_for_target",
    "load_config",
    "parse_override",
    "read_config_file",
    "scale_lr",
]

Precision = Literal["auto", "fp32", "fp16", "bf16"]
LRScaling = Literal["linear", "sqrt", "none"]

PRECISIONS: tuple[str, ...] = get_args(Precision)
LR_SCALING_RULES: tuple[str, ...] = get_args(LRScaling)


class ConfigError(ValueError):
    """A configuration value is missing, mistyped or out of range.

    The message is one line that names the field (and the file, when loaded from one) and
    what is expected, so a command-line tool can print it as is.

    Attributes:
        field: The offending field name (``None`` when the whole document is wrong).
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


# --- validation helpers -------------------------------------------------------------------


def _describe_value(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def _check_int(name: str, value: object, minimum: int) -> None:
    # bool is an int subclass: `per_device_batch_size: true` in YAML must not pass as 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"field '{name}': expected an integer >= {minimum}, got {_describe_value(value)}", name
        )
    if value < minimum:
        raise ConfigError(f"field '{name}': expected an integer >= {minimum}, got {value}", name)


def _check_optional_int(name: str, value: object, minimum: int) -> None:
    if value is not None:
        _check_int(name, value, minimum)


def _check_float(name: str, value: object, *, minimum: float, strict: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"field '{name}': expected a number, got {_describe_value(value)}", name)
    if not math.isfinite(float(value)):
        raise ConfigError(f"field '{name}': expected a finite number, got {value}", name)
    bad = value <= minimum if strict else value < minimum
    if bad:
        op = ">" if strict else ">="
        raise ConfigError(f"field '{name}': expected a number {op} {minimum}, got {value}", name)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
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


# --- the config -----------------------------------------------------------------------------


@dataclass
class TrainingConfig:
    """Hyper-parameters of a training job, with the effective batch made explicit.

    Example:
        >>> cfg = TrainingConfig(per_device_batch_size=32, world_size=8,
        ...                      learning_rate=1e-3, base_batch_size=32)
        >>> cfg.effective_batch_size, round(cfg.scaled_learning_rate, 6)
        (256, 0.008)

    Raises:
        ConfigError: On construction, when a field has the wrong type or is out of range.
    """

    per_device_batch_size: int = 32
    """Samples per micro-batch on each rank (what one forward pass sees)."""

    gradient_accumulation_steps: int = 1
    """Micro-batches summed per rank before each optimizer step (derived when
    ``global_batch_size`` is set)."""

    world_size: int = 1
    """Number of ranks (processes / GPUs) in the job."""

    global_batch_size: int | None = None
    """Samples per optimizer step over all ranks — the job's definition. When set, the
    accumulation is derived as ``global_batch_size / (per_device_batch_size × world_size)``,
    so the same config gives the same math on any GPU count (see :meth:`for_world_size`)."""

    learning_rate: float = 1e-3
    """Learning rate as tuned at ``base_batch_size``."""

    base_batch_size: int | None = None
    """Effective batch the learning rate was tuned at; ``None`` means "this run's batch"."""

    lr_scaling: LRScaling = "linear"
    """How the LR follows the effective batch away from ``base_batch_size``."""

    warmup_steps: int = 0
    """Optimizer steps of linear LR warmup."""

    min_lr_ratio: float = 0.0
    """Final LR of the cosine decay, as a fraction of the peak LR."""

    epochs: int = 1
    """Passes over the training data (ignored when ``max_steps`` is set)."""

    max_steps: int | None = None
    """Total optimizer steps; overrides ``epochs`` when set."""

    precision: Precision = "auto"
    """``auto`` (bf16 where supported, else fp16 on CUDA, fp32 on CPU), ``fp32``, ``fp16``, ``bf16``."""

    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value; ``None`` disables clipping."""

    weight_decay: float = 0.0
    """Decoupled weight decay for AdamW."""

    seed: int = 42
    """Seed for model init, data order and dropout."""

    def __post_init__(self) -> None:
        _check_int("per_device_batch_size", self.per_device_batch_size, 1)
        _check_int("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        _check_int("world_size", self.world_size, 1)
        _check_optional_int("global_batch_size", self.global_batch_size, 1)
        if self.global_batch_size is not None:
            accum = global_batch_plan(
                self.global_batch_size, self.per_device_batch_size, self.world_size
            )
            if self.gradient_accumulation_steps not in (1, accum):
                raise ConfigError(
                    f"field 'gradient_accumulation_steps': {self.gradient_accumulation_steps} "
                    f"contradicts global_batch_size {self.global_batch_size} = "
                    f"{self.per_device_batch_size} per device x {self.world_size} ranks x "
                    f"{accum}; leave it out when global_batch_size is set",
                    "gradient_accumulation_steps",
                )
            self.gradient_accumulation_steps = accum
        _check_float("learning_rate", self.learning_rate, minimum=0.0, strict=True)
        _check_optional_int("base_batch_size", self.base_batch_size, 1)
        _check_choice("lr_scaling", self.lr_scaling, LR_SCALING_RULES)
        _check_int("warmup_steps", self.warmup_steps, 0)
        _check_float("min_lr_ratio", self.min_lr_ratio, minimum=0.0, strict=False)
        if self.min_lr_ratio > 1.0:
            raise ConfigError(
                f"field 'min_lr_ratio': expected a number in [0, 1], got {self.min_lr_ratio}",
                "min_lr_ratio",
            )
        _check_int("epochs", self.epochs, 1)
        _check_optional_int("max_steps", self.max_steps, 1)
        _check_choice("precision", self.precision, PRECISIONS)
        if self.max_grad_norm is not None:
            _check_float("max_grad_norm", self.max_grad_norm, minimum=0.0, strict=True)
        _check_float("weight_decay", self.weight_decay, minimum=0.0, strict=False)
        _check_int("seed", self.seed, 0)
        if self.max_steps is not None and self.warmup_steps > self.max_steps:
            raise ConfigError(
                f"field 'warmup_steps': expected at most max_steps ({self.max_steps}), "
                f"got {self.warmup_steps}",
                "warmup_steps",
            )

    def for_world_size(self, world_size: int) -> TrainingConfig:
        """This config on ``world_size`` ranks.

        With ``global_batch_size`` set, the accumulation is re-derived so the effective batch
        (and the math) stays the same; without it, the per-rank recipe is kept and the
        effective batch scales with the ranks (and :meth:`describe` says so).

        Raises:
            ConfigError: If the global batch does not split over ``world_size`` ranks.
        """
        accum = 1 if self.global_batch_size is not None else self.gradient_accumulation_steps
        return dataclasses.replace(self, world_size=world_size, gradient_accumulation_steps=accum)

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step: per-device batch × accumulation × world size."""
        return self.per_device_batch_size * self.gradient_accumulation_steps * self.world_size

    @property
    def scaled_learning_rate(self) -> float:
        """The learning rate for this run's effective batch (see :func:`scale_lr`)."""
        if self.base_batch_size is None or self.lr_scaling == "none":
            return float(self.learning_rate)
        return scale_lr(
            self.learning_rate, self.base_batch_size, self.effective_batch_size, self.lr_scaling
        )

    def steps_per_epoch(self, num_samples: int) -> int:
        """Optimizer steps in one pass over ``num_samples`` (incomplete last batch dropped).

        Raises:
            ValueError: If ``num_samples`` is negative.
        """
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        return num_samples // self.effective_batch_size

    def total_steps(self, num_samples: int) -> int:
        """Optimizer steps of the whole run: ``max_steps``, else epochs × steps per epoch."""
        if self.max_steps is not None:
            return self.max_steps
        return self.epochs * self.steps_per_epoch(num_samples)

    def batch_warning(self) -> str | None:
        """A warning when the effective batch differs from the one the LR was tuned at."""
        if self.base_batch_size is None or self.base_batch_size == self.effective_batch_size:
            return None
        factor = self.effective_batch_size / self.base_batch_size
        if self.lr_scaling == "none":
            return (
                f"effective batch {self.effective_batch_size} is {factor:g}x the tuned batch "
                f"{self.base_batch_size} but lr_scaling is 'none': the learning rate "
                f"{self.learning_rate:g} was tuned for a different batch"
            )
        return (
            f"effective batch {self.effective_batch_size} is {factor:g}x the tuned batch "
            f"{self.base_batch_size}: learning rate scaled ({self.lr_scaling} rule) from "
            f"{self.learning_rate:g} to {self.scaled_learning_rate:g}; consider a longer warmup"
        )

    def describe(self, num_samples: int | None = None) -> str:
        """A human-readable summary of the batch arithmetic and the learning rate.

        Args:
            num_samples: Size of the training set, to report optimizer steps per epoch.

        Returns:
            Several lines of text, ending with a ``WARNING:`` line when the effective batch
            silently moved away from the tuned batch.
        """
        lines = [
            f"effective batch: {self.effective_batch_size} = {self.per_device_batch_size} per "
            f"device x {self.gradient_accumulation_steps} accumulation x {self.world_size} ranks",
        ]
        if num_samples is not None:
            steps = self.steps_per_epoch(num_samples)
            dropped = num_samples - steps * self.effective_batch_size
            lines.append(
                f"optimizer steps per epoch: {steps} ({num_samples} samples, {dropped} dropped)"
            )
            lines.append(f"total optimizer steps: {self.total_steps(num_samples)}")
        if self.base_batch_size is None:
            lines.append(f"learning rate: {self.learning_rate:g} (no tuned batch given)")
        else:
            lines.append(
                f"learning rate: {self.scaled_learning_rate:g} ({self.lr_scaling} scaling from "
                f"{self.learning_rate:g} at batch {self.base_batch_size})"
            )
        lines.append(f"warmup steps: {self.warmup_steps}, precision: {self.precision}")
        warning = self.batch_warning()
        if warning:
            lines.append(f"WARNING: {warning}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (round-trips through :meth:`from_dict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> TrainingConfig:
        """Build a config from a mapping, rejecting unknown keys with a close-match hint.

        Args:
            data: Field names to values.
            source: A file name to prefix error messages with.

        Raises:
            ConfigError: For an unknown key, a wrong type or an out-of-range value.
        """
        prefix = f"{source}: " if source else ""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{prefix}expected a mapping of field names to values, got {type(data).__name__}"
            )
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                close = difflib.get_close_matches(str(key), names, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(f"{prefix}unknown field '{key}'{hint}", str(key))
        try:
            return cls(**dict(data))
        except ConfigError as err:
            raise ConfigError(f"{prefix}{err}", err.field) from None


_FLOAT_PATTERN = r"""^(?:
    [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
  | [-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
  | \.[0-9_]+(?:[eE][-+]?[0-9]+)?
  | [-+]?\.(?:inf|Inf|INF)
  | \.(?:nan|NaN|NAN))$"""


def _yaml_load(text: str) -> Any:
    """``yaml.safe_load`` that reads ``1e-3`` as a float.

    PyYAML follows YAML 1.1, where a float needs a dot: ``learning_rate: 1e-3`` would be
    the string ``"1e-3"`` and fail validation with a confusing message.
    """
    import re

    import yaml  # deferred: keep `import gpu_training.config` cheap

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(_FLOAT_PATTERN, re.X), list("-+0123456789.")
    )
    return yaml.load(text, Loader=_Loader)


def _yaml_error_line(err: Exception) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return str(problem)


def parse_override(text: str) -> tuple[str, Any]:
    """Split a ``key=value`` override; the value is parsed as YAML (``4`` → int, ``1e-3`` → float).

    Example:
        >>> parse_override("learning_rate=3e-4")
        ('learning_rate', 0.0003)

    Raises:
        ConfigError: When there is no ``=`` or the value is not valid YAML.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. world_size=4")
    try:
        return key, _yaml_load(raw)
    except Exception as err:  # yaml.YAMLError, without importing yaml at module level
        raise ConfigError(
            f"override {text!r}: not valid YAML: {_yaml_error_line(err)}", key
        ) from None


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML/JSON config file into a mapping, without validating the fields.

    Raises:
        ConfigError: When the file is missing, unreadable, unparsable or not a mapping.
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: a directory, expected a YAML or JSON config file")
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{p}: cannot read config: {err}") from None
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else _yaml_load(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{p}: not valid JSON: {err}") from None
    except Exception as err:  # yaml.YAMLError
        raise ConfigError(f"{p}: not valid YAML: {_yaml_error_line(err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{p}: expected a mapping of field names to values, got {type(data).__name__}"
        )
    return data


def load_config(
    path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None
) -> TrainingConfig:
    """Load a :class:`TrainingConfig` from a YAML (``.yaml``/``.yml``) or JSON file.

    Args:
        path: The config file.
        overrides: Field values applied on top of the file before validation (``--set``).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "cfg.yaml"
        >>> _ = p.write_text("per_device_batch_size: 16\\nworld_size: 2\\nlearning_rate: 1e-3\\n")
        >>> cfg = load_config(p, overrides={"world_size": 4})
        >>> cfg.effective_batch_size, cfg.learning_rate
        (64, 0.001)

    Raises:
        ConfigError: When the file is missing, unparsable, or a field is invalid; the
            message names the file and the field.
    """
    data = read_config_file(path)
    source = str(Path(path))
    if not data and not overrides:  # every field at its default is never what it meant
        raise ConfigError(f"{source}: the config file is empty; expected TrainingConfig fields")
    if overrides:
        data.update(overrides)
        source += " (with --set)"
    return TrainingConfig.from_dict(data, source=source)


# --- batch and LR arithmetic --------------------------------------------------------------


@dataclass(frozen=True)
class AccumulationPlan:
    """How a target global batch is reached on a given number of ranks."""

    gradient_accumulation_steps: int
    effective_batch_size: int
    target_effective_batch: int

    @property
    def overshoot(self) -> int:
        """Samples per step above the target (0 when it divides exactly)."""
        return self.effective_batch_size - self.target_effective_batch


def accumulation_plan(
    target_effective_batch: int, per_device_batch_size: int, world_size: int
) -> AccumulationPlan:
    """Accumulation steps that reach at least ``target_effective_batch``, and the batch it gives.

    Raises:
        ConfigError: If an argument is not a positive integer.
    """
    _check_int("target_effective_batch", target_effective_batch, 1)
    _check_int("per_device_batch_size", per_device_batch_size, 1)
    _check_int("world_size", world_size, 1)
    per_step = per_device_batch_size * world_size
    accum = max(1, -(-target_effective_batch // per_step))  # ceil without floats
    return AccumulationPlan(accum, accum * per_step, target_effective_batch)


def gradient_accumulation_for_target(
    target_effective_batch: int, per_device_batch_size: int, world_size: int
) -> int:
    """Gradient accumulation steps so the effective batch is ≥ the target.

    Rounds up; when the target does not divide evenly a :class:`UserWarning` reports the
    actual effective batch, so the change is never silent.

    Example:
        >>> gradient_accumulation_for_target(512, per_device_batch_size=8, world_size=4)
        16

    Raises:
        ConfigError: If an argument is not a positive integer.
    """
    plan = accumulation_plan(target_effective_batch, per_device_batch_size, world_size)
    if plan.overshoot:
        warnings.warn(
            f"target effective batch {target_effective_batch} is not a multiple of "
            f"{per_device_batch_size} per device x {world_size} ranks; using "
            f"{plan.gradient_accumulation_steps} accumulation steps for an effective batch of "
            f"{plan.effective_batch_size}",
            UserWarning,
            stacklevel=2,
        )
    return plan.gradient_accumulation_steps


def _steps(count: int) -> str:
    return f"{count} accumulation step{'s' if count != 1 else ''}"


def global_batch_split_message(
    global_batch_size: int,
    per_device_batch_size: int,
    world_size: int,
    max_global_batch: int | None = None,
) -> str:
    """Why a global batch does not split into ``world_size × per_device_batch_size``, and fixes.

    Example:
        >>> global_batch_split_message(100, 8, 3)[:60]
        'global batch 100 does not split into 3 ranks × per-device ba'
    """
    g, b, w = global_batch_size, per_device_batch_size, world_size
    per_micro = w * b
    ranks = f"{w} rank{'s' if w != 1 else ''}"
    head = (
        f"global batch {g} does not split into {ranks} × per-device batch {b} "
        f"(= {per_micro} samples per micro-step; {g} / {per_micro} = {g / per_micro:.4g} "
        "accumulation steps)"
    )
    lower = g // per_micro * per_micro
    multiples = [m for m in (lower, lower + per_micro) if m > 0]
    if max_global_batch is not None:
        multiples = [m for m in multiples if m <= max_global_batch]
    fixes = []
    if multiples:
        fixes.append(
            "a global batch of " + " or ".join(f"{m} ({_steps(m // per_micro)})" for m in multiples)
        )
    smaller = [d for d in range(b, 0, -1) if g % (w * d) == 0][:2]
    if smaller:
        fixes.append(
            "a per-device batch of " + " or ".join(f"{d} ({_steps(g // (w * d))})" for d in smaller)
        )
    if not multiples and not smaller:
        # Nothing with this per-device batch fits the dataset: offer multiples of the ranks.
        lower_w = g // w * w
        limit = lower_w + w if max_global_batch is None else max_global_batch
        for m in [m for m in (lower_w, lower_w + w) if 0 < m <= limit]:
            d = next(d for d in range(min(b, m // w), 0, -1) if m % (w * d) == 0)
            fixes.append(f"a global batch of {m} (per-device batch {d}, {_steps(m // (w * d))})")
    message = f"{head}: use {', or '.join(fixes)}" if fixes else head
    if not smaller:
        message += f"; no per-device batch works on {ranks} ({g} is not a multiple of {w})"
    if not fixes:
        message += f"; {max_global_batch} samples are too few for {ranks}"
    return message


def global_batch_plan(global_batch_size: int, per_device_batch_size: int, world_size: int) -> int:
    """Accumulation steps ``A`` so that ``world_size × per_device_batch_size × A`` is exactly G.

    Example:
        >>> global_batch_plan(64, per_device_batch_size=8, world_size=2)
        4

    Raises:
        ConfigError: If an argument is not a positive integer or the split is not exact (the
            message names the numbers and suggests batches that fit).
    """
    _check_int("global_batch_size", global_batch_size, 1)
    _check_int("per_device_batch_size", per_device_batch_size, 1)
    _check_int("world_size", world_size, 1)
    if global_batch_size % (per_device_batch_size * world_size):
        raise ConfigError(
            global_batch_split_message(global_batch_size, per_device_batch_size, world_size),
            "global_batch_size",
        )
    return global_batch_size // (per_device_batch_size * world_size)


def scale_lr(base_lr: float, base_batch: int, new_batch: int, rule: str = "linear") -> float:
    """Scale a learning rate tuned at ``base_batch`` to ``new_batch``.

    Args:
        base_lr: The tuned learning rate.
        base_batch: Effective batch it was tuned at.
        new_batch: Effective batch of this run.
        rule: ``"linear"`` (Goyal et al.: k× batch → k× LR), ``"sqrt"`` (√k×, common for
            Adam-family optimizers) or ``"none"``.

    Example:
        >>> scale_lr(1e-3, 256, 2048)
        0.008

    Raises:
        ConfigError: For an unknown rule or non-positive numbers.
    """
    _check_float("base_lr", base_lr, minimum=0.0, strict=True)
    _check_int("base_batch", base_batch, 1)
    _check_int("new_batch", new_batch, 1)
    _check_choice("rule", rule, LR_SCALING_RULES)
    factor = new_batch / base_batch
    if rule == "linear":
        return base_lr * factor
    if rule == "sqrt":
        return base_lr * math.sqrt(factor)
    return base_lr
