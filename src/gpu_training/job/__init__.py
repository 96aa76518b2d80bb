"""The job file: what ``gpu-training train CONFIG.yaml`` runs (no torch needed to check it).

A job has five sections, each a typed dataclass that checks itself::

    task: charlm                 # built-in task, or {model: "pkg.mod:build", data: "pkg.mod:build"}
    task_options: {n_layer: 4}   # the task's own options
    training:  {...}             # TrainingConfig: global batch, LR, precision, steps...
    strategy: ddp                # StrategyConfig: none | ddp | fsdp | deepspeed, or {name: fsdp, ...}
    checkpoint: {every: 50}      # where, how often, how many to keep
    run: {output_dir: runs/demo} # logging, evaluation, metrics

Unknown keys and wrong values are one line naming ``section.field`` (with a close-match
suggestion), exit status 2 from the CLI, and nothing written.

Example:
    >>> job = JobConfig.from_dict({"task": "charlm", "training": {"global_batch_size": 32,
    ...     "per_device_batch_size": 8, "max_steps": 10}, "strategy": {"name": "ddp"}})
    >>> job.training.for_world_size(2).gradient_accumulation_steps
    2
    >>> JobConfig.from_dict({"strategy": {"name": "dpp"}})
    Traceback (most recent call last):
    ...
    gpu_training.config.ConfigError: unknown strategy 'dpp' (did you mean 'ddp'?); expected one of none, ddp, fsdp, deepspeed
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_training.config import ConfigError, TrainingConfig, parse_override, read_config_file
from gpu_training.config.files import apply_override
from gpu_training.job.fingerprint import math_changes, math_settings, older_hashes, settings_hash
from gpu_training.job.sections import TRACKER_NAMES, CheckpointSpec, RunSpec, TaskSpec, TrackerSpec
from gpu_training.strategy.spec import StrategyConfig

__all__ = [
    "TRACKER_NAMES",
    "CheckpointSpec",
    "JobConfig",
    "RunSpec",
    "TaskSpec",
    "TrackerSpec",
    "load_job",
]

_SECTIONS: dict[str, type] = {
    "strategy": StrategyConfig,
    "checkpoint": CheckpointSpec,
    "run": RunSpec,
}


def _section(cls: type, name: str, data: object) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, Mapping):
        raise ConfigError(f"section '{name}': expected a mapping, got {data!r}", name)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{name}.{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown field '{name}.{key}'{hint}", f"{name}.{key}")
    return cls(**dict(data))


@dataclass
class JobConfig:
    """A whole training job: task, training hyper-parameters, strategy, checkpoints, run."""

    task: TaskSpec = field(default_factory=TaskSpec)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    run: RunSpec = field(default_factory=RunSpec)

    @property
    def checkpoint_dir(self) -> Path:
        """``checkpoint.dir``, or ``<run.output_dir>/checkpoints``."""
        return Path(self.checkpoint.dir or Path(self.run.output_dir) / "checkpoints")

    def to_dict(self) -> dict[str, Any]:
        """Plain data that round-trips through :meth:`from_dict`."""
        task = dataclasses.asdict(self.task)
        options = task.pop("options")
        return {
            "task": {k: v for k, v in task.items() if v is not None},
            "task_options": options,
            "training": self.training.to_dict(),
            "strategy": dataclasses.asdict(self.strategy),
            "checkpoint": dataclasses.asdict(self.checkpoint),
            "run": {
                **dataclasses.asdict(self.run),
                "trackers": [t.to_entry() for t in self.run.trackers],
            },
        }

    def math_settings(self) -> dict[str, Any]:
        """The settings that define the run's math: task, task options, training, and what
        a DeepSpeed config file says beyond the layout (it can name its own optimizer:
        :func:`~gpu_training.strategy.spec.deepspeed_math`).

        Not the world size, nor (when a global batch is set) the per-device batch and the
        accumulation: the global batch defines the job, however it is split (promise 1). Nor
        how the strategy lays the model out (its name, FSDP's sharding, activation
        checkpointing, DeepSpeed's ZeRO stage and offload...): they compute the same steps.
        Nor ``task_options.stream_workers``: any worker count feeds a step the same samples
        (:mod:`gpu_training.job.fingerprint`).
        """
        return math_settings(self.to_dict())

    def config_hash(self) -> str:
        """A short hash of :meth:`math_settings`.

        Stored in each checkpoint's manifest (with the settings themselves): resuming with
        another hash names the fields that changed and needs ``--allow-config-change``.
        """
        return settings_hash(self.math_settings())

    def config_hashes(self) -> tuple[str, ...]:
        """:meth:`config_hash`, then the hashes older manifests recorded (while the strategy's
        layout counted as math; then while DeepSpeed's stage, offload and config path did; then
        while ``task_options.stream_workers`` did):
        what a manifest that records only a hash may carry."""
        return self.config_hash(), *older_hashes(self.to_dict())

    def changes_since(self, saved: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        """How this job differs from ``saved`` (a checkpoint's recorded ``to_dict()``).

        Args:
            saved: The job settings a checkpoint recorded.

        Returns:
            ``(math, other)``: lines ``"section.field: old -> new"``, first those of
            :meth:`math_settings` (they change what the run computes), then the rest
            (logging cadence, output paths...: they do not).

        Example:
            >>> old = JobConfig.from_dict({"training": {"learning_rate": 1e-3}})
            >>> new = JobConfig.from_dict({"training": {"learning_rate": 2e-3},
            ...                            "run": {"log_every": 5}})
            >>> new.changes_since(old.to_dict())
            (['training.learning_rate: 0.001 -> 0.002'], ['run.log_every: 10 -> 5'])
        """
        return math_changes(saved, self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> JobConfig:
        """Build and validate a job from a mapping (a parsed YAML/JSON file).

        Raises:
            ConfigError: One line naming ``section.field`` (prefixed with ``source``).
        """
        prefix = f"{source}: " if source else ""
        try:
            return cls._from_dict(data)
        except ConfigError as err:
            raise ConfigError(f"{prefix}{err}", err.field) from None

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> JobConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(f"expected a mapping of sections, got {type(data).__name__}")
        known = ["task", "task_options", "training", *_SECTIONS]
        for key in data:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(f"unknown section '{key}'{hint}", str(key))
        task_raw = data.get("task", "charlm")
        options = data.get("task_options") or {}
        if isinstance(task_raw, str):
            task = TaskSpec(name=task_raw, options=options)
        elif isinstance(task_raw, Mapping):
            if "options" in task_raw:  # TaskSpec's field, filled from task_options only
                raise ConfigError(
                    "unknown field 'task.options': a task's options are the section "
                    "'task_options' (task_options: {n_layer: 2})",
                    "task.options",
                )
            task = _section(TaskSpec, "task", {**task_raw, "options": options})
        else:
            raise ConfigError(f"section 'task': expected a name or a mapping, got {task_raw!r}")
        training_raw = data.get("training") or {}
        if not isinstance(training_raw, Mapping):
            raise ConfigError(f"section 'training': expected a mapping, got {training_raw!r}")
        try:
            training = TrainingConfig.from_dict(training_raw)
        except ConfigError as err:
            field_name = f"training.{err.field}" if err.field else "training"
            message = str(err).replace(f"'{err.field}'", f"'{field_name}'", 1)
            raise ConfigError(message, field_name) from None
        raw = {**data, "strategy": _strategy_mapping(data.get("strategy"))}
        sections = {name: _section(kind, name, raw.get(name)) for name, kind in _SECTIONS.items()}
        return cls(task=task, training=training, **sections)


def _strategy_mapping(raw: object) -> object:
    """``strategy: fsdp`` as ``strategy: {name: fsdp}``: the short spelling of a bare name."""
    return {"name": raw} if isinstance(raw, str) else raw


def load_job(
    path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = ()
) -> JobConfig:
    """Load a job file and apply ``section.field=value`` overrides (``--set``).

    A relative ``strategy.deepspeed_config`` in the file is found next to the file (as
    written in a shipped config) when it is not found from the working directory.

    Raises:
        ConfigError: For an unreadable file or any invalid field; the message names the file.
    """
    data = read_config_file(path)
    if not data:  # an empty file would otherwise train the default job without a word
        raise ConfigError(
            f"{Path(path)}: the job file is empty; give at least a 'training' section "
            "(see configs/ddp_config.yaml)"
        )
    strategy = data["strategy"] = _strategy_mapping(data.get("strategy"))  # --set adds to it
    if isinstance(strategy, dict) and isinstance(strategy.get("deepspeed_config"), str):
        ds = Path(strategy["deepspeed_config"])
        beside = Path(path).parent / ds
        if not ds.is_absolute() and not ds.exists() and beside.exists():
            strategy["deepspeed_config"] = str(beside)
    for text in overrides:
        key, value = parse_override(text)
        apply_override(data, key, value)
    source = str(Path(path)) + (" (with --set)" if overrides else "")
    return JobConfig.from_dict(data, source=source)
