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
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_training.config import ConfigError, TrainingConfig, parse_override, read_config_file
from gpu_training.config.checks import check_int, check_optional_int
from gpu_training.config.files import apply_override
from gpu_training.strategy.spec import StrategyConfig, deepspeed_math

__all__ = [
    "TRACKER_NAMES",
    "CheckpointSpec",
    "JobConfig",
    "RunSpec",
    "TaskSpec",
    "TrackerSpec",
    "load_job",
]

TRACKER_NAMES = ("jsonl", "tensorboard", "wandb", "mlflow")
"""The names ``run.trackers`` accepts."""

_TRACKER_OPTIONS: dict[str, tuple[str, ...]] = {
    "project": ("wandb", "mlflow"),
    "run_name": ("wandb", "mlflow"),
    "mode": ("wandb",),
    "tracking_uri": ("mlflow",),
}
_WANDB_MODES = ("offline", "online")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"field '{name}': expected true or false, got {value!r}", name)


def _check_str(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise ConfigError(f"field '{name}': expected a non-empty string, got {value!r}", name)


@dataclass
class TaskSpec:
    """What to train: a built-in task by name, or the user's model and data factories."""

    name: str | None = "charlm"
    """A built-in task (``charlm``); ``None`` when ``model`` and ``data`` are given."""

    model: str | None = None
    """Import string ``pkg.module:function`` returning an ``nn.Module``."""

    data: str | None = None
    """Import string returning ``(train_dataset, val_dataset_or_None)``."""

    loss: str | None = None
    """Import string of ``loss(outputs, targets) -> Tensor`` (default: cross-entropy)."""

    options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the built-in task (e.g. ``n_layer`` for ``charlm``)."""

    def __post_init__(self) -> None:
        for name in ("model", "data", "loss"):
            value = getattr(self, name)
            _check_str(f"task.{name}", value, optional=True)
            if value is not None and ":" not in value:
                raise ConfigError(
                    f"field 'task.{name}': expected an import string 'package.module:function', "
                    f"got {value!r}",
                    f"task.{name}",
                )
        if (self.model is None) != (self.data is None):
            missing = "data" if self.data is None else "model"
            raise ConfigError(
                f"field 'task.{missing}': a user task needs both model and data import strings",
                f"task.{missing}",
            )
        if self.model is not None:
            self.name = None
        _check_str("task.name", self.name, optional=self.model is not None)
        if not isinstance(self.options, dict):
            raise ConfigError(
                f"field 'task_options': expected a mapping, got {self.options!r}", "task_options"
            )


@dataclass
class CheckpointSpec:
    """Where checkpoints go and how often."""

    dir: str | None = None
    """Checkpoint directory (default: ``<run.output_dir>/checkpoints``)."""

    every: int = 100
    """Save every this many optimizer steps (and at the end, and on preemption)."""

    keep_last_n: int = 3
    """Committed checkpoints to keep."""

    resume: bool = True
    """Continue from the newest complete checkpoint when one exists."""

    def __post_init__(self) -> None:
        _check_str("checkpoint.dir", self.dir, optional=True)
        check_int("checkpoint.every", self.every, 1)
        check_int("checkpoint.keep_last_n", self.keep_last_n, 1)
        _check_bool("checkpoint.resume", self.resume)


@dataclass
class TrackerSpec:
    """One entry of ``run.trackers``: a tracker's name and its options.

    In a job file an entry is a name (``wandb``) or a mapping with ``name`` and options
    (``{name: mlflow, tracking_uri: "http://mlflow:5000"}``).

    Example:
        >>> TrackerSpec.from_entry({"name": "wandb", "project": "lm"}, 0).to_entry()
        {'name': 'wandb', 'project': 'lm'}
        >>> TrackerSpec("mlfow")
        Traceback (most recent call last):
        ...
        gpu_training.config.ConfigError: field 'run.trackers': unknown tracker 'mlfow' (did you mean 'mlflow'?); expected one of jsonl, tensorboard, wandb, mlflow
    """

    name: str
    """``jsonl`` (``metrics.jsonl``, always written), ``tensorboard``, ``wandb`` or ``mlflow``."""

    project: str | None = None
    """wandb: the project; mlflow: the experiment (default ``gpu-training`` for both)."""

    run_name: str | None = None
    """wandb, mlflow: the run's display name (default: the output directory's name)."""

    mode: str | None = None
    """wandb: ``offline`` (the default: files under ``<run.output_dir>/wandb``, uploaded later
    by ``wandb sync``) or ``online``."""

    tracking_uri: str | None = None
    """mlflow: where runs go (default ``file:<run.output_dir>/mlruns``, a local store; or a
    server's ``http://`` address, or a ``sqlite:`` database)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or self.name not in TRACKER_NAMES:
            close = difflib.get_close_matches(str(self.name), TRACKER_NAMES, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(
                f"field 'run.trackers': unknown tracker {self.name!r}{hint}; expected one of "
                f"{', '.join(TRACKER_NAMES)}",
                "run.trackers",
            )
        for option, owners in _TRACKER_OPTIONS.items():
            value = getattr(self, option)
            if value is None:
                continue
            where = f"field 'run.trackers': {self.name} option '{option}'"
            if self.name not in owners:
                raise ConfigError(
                    f"{where} is not one of its options ({option} is for {' and '.join(owners)})",
                    "run.trackers",
                )
            if not isinstance(value, str) or not value:
                raise ConfigError(
                    f"{where}: expected a non-empty string, got {value!r}", "run.trackers"
                )
        if self.mode is not None and self.mode not in _WANDB_MODES:
            raise ConfigError(
                f"field 'run.trackers': wandb option 'mode': expected one of "
                f"{', '.join(_WANDB_MODES)}, got {self.mode!r}",
                "run.trackers",
            )

    @classmethod
    def from_entry(cls, entry: object, index: int) -> TrackerSpec:
        """A spec from a job file's entry: a name, a mapping with ``name``, or a spec.

        Args:
            entry: The entry as parsed from YAML.
            index: Its position in the list (for the error message).

        Raises:
            ConfigError: Naming ``run.trackers`` for an unknown name or option.
        """
        if isinstance(entry, TrackerSpec):
            return entry
        if isinstance(entry, str):
            return cls(name=entry)
        if isinstance(entry, Mapping):
            names = [f.name for f in dataclasses.fields(cls)]
            for key in entry:
                if key not in names:
                    close = difflib.get_close_matches(str(key), names, n=1)
                    hint = f" (did you mean '{close[0]}'?)" if close else ""
                    raise ConfigError(
                        f"field 'run.trackers': unknown option '{key}' in entry {index}{hint}",
                        "run.trackers",
                    )
            if "name" not in entry:
                raise ConfigError(
                    f"field 'run.trackers': entry {index} has no 'name' (one of "
                    f"{', '.join(TRACKER_NAMES)})",
                    "run.trackers",
                )
            return cls(**{str(k): v for k, v in entry.items()})
        raise ConfigError(
            f"field 'run.trackers': entry {index} must be a tracker name or a mapping with "
            f"'name', got {entry!r}",
            "run.trackers",
        )

    def to_entry(self) -> str | dict[str, str]:
        """The job-file form: the bare name when no option is set."""
        options = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return self.name if len(options) == 1 else options


def _default_trackers() -> list[TrackerSpec]:
    return [TrackerSpec("jsonl"), TrackerSpec("tensorboard")]


@dataclass
class RunSpec:
    """Outputs, logging and evaluation."""

    output_dir: str = "runs/job"
    """Metrics (``metrics.jsonl``), plots, TensorBoard events and (by default) checkpoints."""

    log_every: int = 10
    """Reduce metrics over ranks and log them every this many optimizer steps; a preemption
    signal (SIGTERM/SIGUSR1) is acted on at these steps too."""

    eval_every: int = 100
    """Evaluate on the validation set every this many steps (and at the end)."""

    eval_batches: int | None = 20
    """Validation *global* batches per evaluation (``None``: the whole set): the same samples
    on any number of ranks, each rank scoring every ``world_size``-th of them."""

    progress: bool = True
    """Show a progress bar (rank 0 only, and only on a terminal)."""

    trackers: list[TrackerSpec] = field(default_factory=_default_trackers)
    """Where metrics go, rank 0 only: ``jsonl`` (``metrics.jsonl``, always written),
    ``tensorboard`` (when the extra is installed), ``wandb`` (offline by default) and
    ``mlflow`` (a local store by default); the last two need the ``trackers`` extra, log the
    job and the environment as the run's parameters, and continue the same run on resume
    (its id is kept in the checkpoint). Entries are names or mappings with options
    (:class:`TrackerSpec`). A tracker that fails warns once and training goes on."""

    tensorboard: bool = True
    """``false`` drops ``tensorboard`` from ``run.trackers`` (older spelling); true iff listed."""

    plot: bool = True
    """Draw ``loss.png`` at the end when the ``plot`` extra is installed."""

    compile: bool = False
    """``torch.compile`` the model in place (same checkpoint keys): faster steps on GPUs after a
    slow first one (tens of seconds). Not with ``deepspeed``."""

    tf32: bool | None = None
    """TF32 matmuls and convolutions on CUDA; ``None``: on with bf16/fp16, off for exact fp32."""

    peak_tflops: float | None = None
    """The accelerator's dense peak, for MFU in the log (default: from the GPU's name)."""

    stall_timeout: float | None = None
    """Seconds without an optimizer step (or an evaluation or save finishing) after which the
    watchdog ends the run: every rank's stack dumped, the stalled rank named, exit code 124.
    ``None``: ``GPU_TRAINING_STALL_TIMEOUT``, else none (``train --stall-timeout S`` sets it)."""

    telemetry: bool = True
    """Each rank appends its step times to ``telemetry/rank<N>.jsonl`` (``gpu-training watch``)."""

    def __post_init__(self) -> None:
        _check_str("run.output_dir", self.output_dir)
        check_int("run.log_every", self.log_every, 1)
        check_int("run.eval_every", self.eval_every, 1)
        check_optional_int("run.eval_batches", self.eval_batches, 1)
        for name in ("progress", "tensorboard", "plot", "compile", "telemetry"):
            _check_bool(f"run.{name}", getattr(self, name))
        self.trackers = _check_trackers(self.trackers, tensorboard=self.tensorboard)
        self.tensorboard = any(t.name == "tensorboard" for t in self.trackers)
        if self.tf32 is not None:
            _check_bool("run.tf32", self.tf32)
        for name in ("peak_tflops", "stall_timeout"):
            _check_positive_number(f"run.{name}", getattr(self, name))


def _check_positive_number(name: str, value: object) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
    ):
        raise ConfigError(f"field '{name}': expected a number > 0, got {value!r}", name)


def _check_trackers(raw: object, *, tensorboard: bool) -> list[TrackerSpec]:
    if not isinstance(raw, (list, tuple)):
        raise ConfigError(
            f"field 'run.trackers': expected a list of tracker names, got {raw!r}", "run.trackers"
        )
    specs = [TrackerSpec.from_entry(entry, i) for i, entry in enumerate(raw)]
    names = [s.name for s in specs]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"field 'run.trackers': '{name}' is listed twice", "run.trackers")
    if not tensorboard:  # the older switch wins: false has always meant no events
        specs = [s for s in specs if s.name != "tensorboard"]
    return specs


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
        """
        return _math_settings(self.to_dict())

    def config_hash(self) -> str:
        """A short hash of :meth:`math_settings`.

        Stored in each checkpoint's manifest (with the settings themselves): resuming with
        another hash names the fields that changed and needs ``--allow-config-change``.
        """
        return _hash(self.math_settings())

    def config_hashes(self) -> tuple[str, ...]:
        """:meth:`config_hash`, then the hashes older manifests recorded (while the strategy's
        layout counted as math; then while DeepSpeed's stage, offload and config path did):
        what a manifest that records only a hash may carry."""
        job = self.to_dict()
        return self.config_hash(), *(_hash(_math_settings(job, then=t)) for t in _OLDER)

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
        now = json.loads(json.dumps(self.to_dict(), default=str))  # tuples as lists, as saved
        math_now, math_then = _flat(self.math_settings()), _flat(_math_settings(saved))
        rest_now = {k: v for k, v in _flat(now).items() if k not in _flat_keys_of_math(now)}
        rest_then = {k: v for k, v in _flat(saved).items() if k not in _flat_keys_of_math(saved)}
        return _diff(math_then, math_now), _diff(rest_then, rest_now)

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


_LAYOUT_FIELDS = {f.name for f in dataclasses.fields(StrategyConfig)}
"""Every strategy field lays the run out: only what a DeepSpeed file says is math."""
_OLDER: dict[str, set[str]] = {
    "layout": _LAYOUT_FIELDS - {"tensor_parallel", "tp_plan"},  # every field then, but TP's
    "deepspeed": {"deepspeed_config", "zero_stage", "offload", "cpu_offload"},
}
"""The strategy fields older definitions counted, oldest first (config_hashes)."""


def _hash(settings: Mapping[str, Any]) -> str:
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _math_settings(job: Mapping[str, Any], *, then: str | None = None) -> dict[str, Any]:
    training = dict(job.get("training") or {})
    training.pop("world_size", None), training.pop("max_nonfinite_steps", None)  # not math
    if training.get("global_batch_size") is not None:  # any split of it: the same math
        training.pop("gradient_accumulation_steps", None)
        training.pop("per_device_batch_size", None)
    payload = {k: job.get(k) for k in ("task", "task_options", "strategy")}
    strategy = payload["strategy"]
    keep = _OLDER[then] if then is not None else None
    if isinstance(strategy, Mapping) and then is None:
        payload["strategy"] = {"deepspeed": deepspeed_math(strategy)}
    elif isinstance(strategy, Mapping) and keep is not None:  # as manifests hashed it then
        payload["strategy"] = {k: v for k, v in strategy.items() if k in keep}
    payload["training"] = training
    return payload


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{name}."))  # an empty section adds no keys
        else:
            out[name] = value
    return out


def _flat_keys_of_math(job: Mapping[str, Any]) -> set[str]:
    keys = set(_flat(_math_settings(job)))
    training = job.get("training") or {}
    # the rank count is not the math; neither is the accumulation it implies, nor the layout
    keys |= {"training.world_size", *(f"strategy.{name}" for name in _LAYOUT_FIELDS)}
    if training.get("global_batch_size") is not None:
        keys |= {"training.gradient_accumulation_steps", "training.per_device_batch_size"}
    return keys


def _diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    missing = object()
    lines = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, missing), new.get(key, missing)
        if before != after:
            show = [
                ("(unset)" if v is missing else json.dumps(v, default=str)) for v in (before, after)
            ]
            lines.append(f"{key}: {show[0]} -> {show[1]}")
    return lines


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
