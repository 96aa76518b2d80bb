"""Experiment trackers: Weights & Biases and MLflow beside ``metrics.jsonl`` and TensorBoard.

``run.trackers`` in the job file names them (:class:`~gpu_training.job.TrackerSpec`);
:class:`~gpu_training.reporting.MetricsWriter` opens them on rank 0 with :func:`open_trackers`
and sends each record it writes to ``metrics.jsonl`` to every tracker too, as
``<split>/<name>`` at the same optimizer step.

* **wandb**: offline by default: the run's files go to ``<run.output_dir>/wandb/``, one
  ``offline-run-*-<id>`` directory per start of the job; ``wandb sync`` uploads them later.
* **mlflow**: a local store by default (``file:<run.output_dir>/mlruns``), through
  ``MlflowClient`` (no global active run); ``mlflow ui --backend-store-uri ...`` shows it.

Both record the resolved job (``JobConfig.to_dict()``) and the environment
(:func:`run_environment`) as the run's parameters. Their run ids go into every checkpoint,
so a resumed job continues the same tracker runs; steps the killed job had already sent
after its last checkpoint are not sent twice (they keep the values first logged, which exact
resume makes the same losses). A tracker that cannot start or whose write raises warns once
and is off for the rest of the run: training never stops for a tracker.

Only the trackers a run names are imported, when it starts: ``import gpu_training`` stays
free of torch, wandb and mlflow.

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> trackers = open_trackers([], TrackerStart(output_dir=out))
    >>> trackers.run_ids, trackers.describe()
    ({}, '')
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpu_training.job import TrackerSpec

__all__ = [
    "Tracker",
    "TrackerSet",
    "TrackerStart",
    "open_trackers",
    "run_environment",
    "tracker_params",
]

_DEFAULT_PROJECT = "gpu-training"
_INSTALL_HINT = "pip install 'gpu-training[trackers]'"
# MLflow's documented limits on one log_batch call and on a parameter's value.
_MLFLOW_MAX_PARAMS_PER_BATCH = 100
_MLFLOW_MAX_METRICS_PER_BATCH = 1000
_MLFLOW_MAX_PARAM_LENGTH = 6000


class Tracker(Protocol):
    """What :class:`TrackerSet` needs of one tracker."""

    name: str
    run_id: str

    def log(self, split: str, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` of ``split`` at optimizer step ``step``."""

    def close(self, error: BaseException | None) -> None:
        """End this run's segment (``error``: what stopped the job, None when it ended well)."""

    def describe(self) -> str:
        """One phrase for the run's header: where the run's data goes."""


@dataclass(frozen=True)
class TrackerStart:
    """What every tracker starts from.

    Attributes:
        output_dir: ``run.output_dir``: the default home of offline and local data.
        params: The run's parameters, nested (``{"job": ..., "environment": ...}``).
        run_ids: Tracker name -> run id kept in the checkpoint the job resumes from.
        logged_through: Split -> the highest step a killed job had already sent (the
            records ``metrics.jsonl`` dropped past the resumed step); a continued tracker
            run skips those steps so none appears twice.
    """

    output_dir: Path
    params: Mapping[str, Any] = field(default_factory=dict)
    run_ids: Mapping[str, str] = field(default_factory=dict)
    logged_through: Mapping[str, int] = field(default_factory=dict)

    @property
    def run_name(self) -> str:
        """The default display name: the output directory's name."""
        return Path(self.output_dir).absolute().name


def run_environment(world_size: int = 1, device: Any = None) -> dict[str, Any]:
    """Versions and place of this run, logged as the trackers' parameters (imports torch).

    Args:
        world_size: Ranks in the job.
        device: The rank-0 device (``torch.device``); a CUDA one adds the GPU's name.

    Returns:
        ``python``, ``torch``, ``gpu_training``, ``cuda`` (None on a CPU build), ``device``,
        ``world_size``, ``hostname`` and ``platform``.
    """
    import torch

    from gpu_training import __version__

    name = "cpu"
    if device is not None and getattr(device, "type", None) == "cuda":
        name = torch.cuda.get_device_name(device)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu_training": __version__,
        "cuda": torch.version.cuda,
        "device": name,
        "world_size": world_size,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
    }


def tracker_params(
    job: Mapping[str, Any], world_size: int = 1, device: Any = None
) -> dict[str, Any]:
    """The run parameters the trackers record: the resolved job and the environment.

    Args:
        job: ``JobConfig.to_dict()``.
        world_size: Ranks in the job.
        device: The rank-0 device.

    Returns:
        ``{"job": job, "environment": run_environment(world_size, device)}``.
    """
    return {"job": dict(job), "environment": run_environment(world_size, device)}


class TrackerSet:
    """The trackers of one run: each record goes to all; one that raises is dropped.

    Args:
        trackers: The started trackers.
        run_ids: Tracker name -> run id, kept in checkpoints (ids of trackers that failed
            to start are kept too, so a later resume can continue their runs).
    """

    def __init__(self, trackers: Sequence[Tracker], run_ids: Mapping[str, str]) -> None:
        self._active = list(trackers)
        self._run_ids = dict(run_ids)
        self._described = ", ".join(f"{t.name} ({t.describe()})" for t in self._active)

    @property
    def run_ids(self) -> dict[str, str]:
        """Tracker name -> run id, to keep in the checkpoint."""
        return dict(self._run_ids)

    def describe(self) -> str:
        """``wandb (offline, runs/x/wandb, run 3f9a...), mlflow (...)``, or ``""``."""
        return self._described

    def log(self, split: str, step: int, values: Mapping[str, float]) -> None:
        """Send one record to every tracker still working."""
        for tracker in list(self._active):
            try:
                tracker.log(split, step, values)
            except Exception as err:  # a tracker's failure, of any kind, must not stop training
                self._drop(tracker, f"at step {step}", err)

    def close(self, error: BaseException | None = None) -> None:
        """End every tracker's run segment; ``error``: what stopped the job, if anything.

        A tracker that raises here warns, as for writes.
        """
        for tracker in list(self._active):
            try:
                tracker.close(error)
            except Exception as err:  # same rule on the way out
                self._drop(tracker, "while closing", err, close=False)
        self._active.clear()

    def _drop(self, tracker: Tracker, when: str, err: Exception, *, close: bool = True) -> None:
        self._active.remove(tracker)
        _warn(
            f"tracker '{tracker.name}' failed {when} ({type(err).__name__}: {err}); it is off "
            "for the rest of the run, training goes on"
        )
        if close:
            with contextlib.suppress(Exception):  # it already failed: one warning is enough
                tracker.close(err)


def open_trackers(specs: Sequence[TrackerSpec], start: TrackerStart) -> TrackerSet:
    """Start the external trackers of ``specs`` (``jsonl`` and ``tensorboard`` are skipped:
    :class:`~gpu_training.reporting.MetricsWriter` writes those itself).

    A tracker that cannot start (its package is missing, its store refuses) warns once
    and the others start anyway.

    Args:
        specs: ``run.trackers``.
        start: Output directory, parameters, kept run ids and steps already sent.

    Returns:
        The started trackers.
    """
    builders: dict[str, Callable[[TrackerSpec, TrackerStart], Tracker]] = {
        "wandb": _WandbTracker,
        "mlflow": _MlflowTracker,
    }
    started: list[Tracker] = []
    run_ids = {k: v for k, v in start.run_ids.items() if k in builders}
    for spec in specs:
        builder = builders.get(spec.name)
        if builder is None:
            continue
        try:
            tracker = builder(spec, start)
        except Exception as err:  # ImportError included: the run goes on without it
            hint = f"; {_INSTALL_HINT}" if isinstance(err, ImportError) else ""
            _warn(
                f"tracker '{spec.name}' could not start ({type(err).__name__}: {err}){hint}; "
                "the run goes on without it"
            )
            continue
        started.append(tracker)
        run_ids[spec.name] = tracker.run_id
    return TrackerSet(started, run_ids)


def _warn(message: str) -> None:
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=4)
    except RuntimeWarning:  # `-W error` made it an exception: a tracker still never stops a run
        print(f"warning: {message}", file=sys.stderr, flush=True)


def _flat_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"job": {"training": {"seed": 1}}}`` -> ``{"job.training.seed": "1"}``."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flat_params(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:_MLFLOW_MAX_PARAM_LENGTH]
    return out


class _WandbTracker:
    """A W&B run: offline files by default, the same run id continued on resume."""

    name = "wandb"

    def __init__(self, spec: TrackerSpec, start: TrackerStart) -> None:
        import wandb

        kept = start.run_ids.get(self.name)
        self.mode = spec.mode or "offline"
        options: dict[str, Any] = {  # Any: wandb types mode and reinit as Literals
            "project": spec.project or _DEFAULT_PROJECT,
            "name": spec.run_name or start.run_name,
            "id": kept,
            "resume": "allow" if kept else None,
            "dir": str(start.output_dir),
            "mode": self.mode,
            # A run of its own, whatever wandb.init the user's script made; our stdout as is.
            "reinit": "create_new",
            "settings": wandb.Settings(console="off"),
        }
        self._run = wandb.init(**options)
        self.run_id = str(self._run.id)
        self.dir = Path(self._run.dir).parent  # .../wandb/offline-run-<time>-<id>
        self._run.config.update(dict(start.params), allow_val_change=True)
        # Steps the killed job sent: metrics.jsonl knows them; online, W&B knows its next step.
        self._through = dict(start.logged_through) if kept else {}
        self._next = int(self._run.starting_step or 0) if kept else 0

    def log(self, split: str, step: int, values: Mapping[str, float]) -> None:
        if step < self._next or step <= self._through.get(split, -1):
            return  # already in the run: W&B keeps one value per step, the first
        self._run.log({f"{split}/{k}": float(v) for k, v in values.items()}, step=step)

    def close(self, error: BaseException | None) -> None:
        self._run.finish(exit_code=0 if error is None else 1)

    def describe(self) -> str:
        return f"{self.mode}, {self.dir}, run {self.run_id}"


class _MlflowTracker:
    """An MLflow run through ``MlflowClient``: the same run id continued on resume."""

    name = "mlflow"

    def __init__(self, spec: TrackerSpec, start: TrackerStart) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.uri = spec.tracking_uri or (Path(start.output_dir).absolute() / "mlruns").as_uri()
        with _file_store_allowed(self.uri):
            self._client = MlflowClient(tracking_uri=self.uri)
        kept = start.run_ids.get(self.name)
        existing = self._existing_run(kept) if kept else None
        params = _flat_params(start.params)
        self._through: dict[str, int] = {}
        if existing is not None:
            self.run_id = existing.info.run_id
            self._client.update_run(self.run_id, status="RUNNING")
            logged = existing.data.params
            # MLflow refuses to change a parameter: a resumed job's new values become tags.
            changed = [
                RunTag(f"resumed.{k}", v) for k, v in params.items() if logged.get(k, v) != v
            ]
            if changed:
                self._client.log_batch(self.run_id, tags=changed)
            params = {k: v for k, v in params.items() if k not in logged}
            self._through = dict(start.logged_through)
        else:
            if kept:
                _warn(
                    f"tracker 'mlflow': the run {kept} kept in the checkpoint is not in "
                    f"{self.uri}; starting a new run"
                )
            experiment = spec.project or _DEFAULT_PROJECT
            found = self._client.get_experiment_by_name(experiment)
            experiment_id = (
                found.experiment_id if found else self._client.create_experiment(experiment)
            )
            run = self._client.create_run(experiment_id, run_name=spec.run_name or start.run_name)
            self.run_id = run.info.run_id
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), _MLFLOW_MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=items[i : i + _MLFLOW_MAX_PARAMS_PER_BATCH])

    def _existing_run(self, run_id: str) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return self._client.get_run(run_id)
        except MlflowException:  # another store than the one the id came from
            return None

    def log(self, split: str, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        if step <= self._through.get(split, -1):
            return  # sent before the job was killed: one value per step
        now = int(time.time() * 1000)
        metrics = [Metric(f"{split}/{k}", float(v), now, step) for k, v in values.items()]
        for i in range(0, len(metrics), _MLFLOW_MAX_METRICS_PER_BATCH):
            batch = metrics[i : i + _MLFLOW_MAX_METRICS_PER_BATCH]
            self._client.log_batch(self.run_id, metrics=batch)

    def close(self, error: BaseException | None) -> None:
        status = "FINISHED" if error is None else "FAILED"
        if isinstance(error, KeyboardInterrupt):
            status = "KILLED"
        self._client.set_terminated(self.run_id, status=status)

    def describe(self) -> str:
        return f"{self.uri}, run {self.run_id}"


@contextlib.contextmanager
def _file_store_allowed(uri: str) -> Iterator[None]:
    """MLflow 3 refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE`` is set.

    The store is built once per URI (MLflow caches it), so the variable is needed only
    while the client is made; it is put back as it was.
    """
    if not uri.startswith("file:"):
        yield
        return
    saved = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = saved
