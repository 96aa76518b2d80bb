"""The job file's own sections: ``task``, ``checkpoint``, ``run`` and its tracker entries.

Each is a typed dataclass that checks itself in ``__post_init__``; a bad value is one
:class:`~gpu_training.config.ConfigError` line naming ``section.field``. The ``training`` and
``strategy`` sections live with what they configure (:mod:`gpu_training.config`,
:mod:`gpu_training.strategy.spec`); :class:`~gpu_training.job.JobConfig` puts them together.

Example:
    >>> CheckpointSpec(every=50).keep_last_n
    3
    >>> CheckpointSpec(every=0)
    Traceback (most recent call last):
    ...
    gpu_training.config.ConfigError: field 'checkpoint.every': expected an integer >= 1, got 0
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_training.config import ConfigError
from gpu_training.config.checks import check_int, check_optional_int

__all__ = ["TRACKER_NAMES", "CheckpointSpec", "RunSpec", "TaskSpec", "TrackerSpec"]

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
