"""Reading config files: YAML or JSON into a validated :class:`TrainingConfig`, ``--set`` overrides.

PyYAML is imported when a file or an override is read, not before: ``import
gpu_training.config`` stays cheap. No torch import.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_training.config.checks import ConfigError
from gpu_training.config.training import TrainingConfig

__all__ = ["apply_override", "load_config", "parse_override", "read_config_file"]


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


def apply_override(data: dict[str, Any], dotted: str, value: Any, *, flag: str = "--set") -> None:
    """Sets ``data[a][b][c] = value`` for ``dotted`` ``"a.b.c"``, making missing sections.

    Example:
        >>> job = {"training": {"max_steps": 10}}
        >>> apply_override(job, "training.max_steps", 20)
        >>> job
        {'training': {'max_steps': 20}}

    Raises:
        ConfigError: A part of the path is a value, not a section (``flag`` names the option).
    """
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{flag} {dotted}: '{part}' is not a section", dotted)
        node = child
    node[parts[-1]] = value


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
