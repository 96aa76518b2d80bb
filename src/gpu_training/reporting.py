"""What a run tells its user: console lines, a metrics file, TensorBoard, and a loss plot.

Only rank 0 reports. :class:`MetricsWriter` appends one JSON object per event to
``metrics.jsonl`` (a resumed run continues the same file, first cutting it back to the step
it resumed from, so every step appears once), mirrors scalars to TensorBoard
when the ``tensorboard`` extra is installed and to the experiment trackers of
``run.trackers`` (:mod:`gpu_training.trackers`: W&B, MLflow), and :func:`plot_metrics` draws
loss and throughput curves to a PNG with the ``plot`` extra. :func:`log_line` is the console
line of a log step, :func:`progress_bar` the bar shown on a terminal.

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> with MetricsWriter(out, tensorboard=False) as writer:
    ...     writer.write("train", 10, {"loss": 2.5, "lr": 1e-3})
    >>> read_metrics(out / "metrics.jsonl")[0]["loss"]
    2.5
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_training.job import TrackerSpec
    from gpu_training.trackers import TrackerSet

__all__ = [
    "MetricsWriter",
    "log_line",
    "plot_metrics",
    "progress_bar",
    "read_metrics",
    "run_banner",
    "run_outputs",
]


def run_banner(task: Any, training: str, strategy: str, step: int, total: int) -> list[str]:
    """The first lines a run prints: its task, its training settings, its strategy, its steps.

    Example:
        >>> from types import SimpleNamespace
        >>> task = SimpleNamespace(name="charlm", describe="", baseline=4.17)
        >>> run_banner(task, "global batch 8", "ddp on 2 rank(s), precision fp32", 0, 20)
        ['task: charlm', 'global batch 8', 'strategy: ddp on 2 rank(s), precision fp32', 'steps: 20 (starting at 0)', 'baseline loss: 4.1700']
    """
    lines = [
        f"task: {task.name}" + (f" ({task.describe})" if task.describe else ""),
        training,
        f"strategy: {strategy}",
        f"steps: {total} (starting at {step})",
    ]
    if task.baseline is not None:
        lines.append(f"baseline loss: {task.baseline:.4f}")
    return lines


def run_outputs(
    checkpoints: str | os.PathLike[str], every: str, writer: MetricsWriter, done_at: int | None
) -> list[str]:
    """Where a run writes: its checkpoints, metrics, TensorBoard and trackers (and, with
    ``done_at``, that the run was already complete at that step)."""
    lines = [
        f"checkpoints: {checkpoints} ({every})",
        f"metrics: {writer.path}"
        + (f", TensorBoard: {writer.tensorboard_dir}" if writer.tensorboard_dir else ""),
    ]
    if writer.trackers:
        lines.append(f"trackers: {writer.trackers}")
    if done_at is not None:
        lines.append(f"run already complete at step {done_at}: delete {checkpoints} to start over")
    return lines


def log_line(step: int, total: int, metrics: Mapping[str, float]) -> str:
    """The console line of a log step: loss, learning rate, gradient norm, throughput, MFU.

    Args:
        step: Optimizer steps done.
        total: Steps of the run.
        metrics: ``loss``, ``lr``, ``grad_norm``, ``global_samples_per_s``, ``tokens_per_s``
            (with ``global_tokens_per_s`` when non-zero) and optionally ``mfu``.

    Example:
        >>> log_line(10, 100, {"loss": 2.5, "lr": 1e-3, "grad_norm": 0.5,
        ...                    "global_samples_per_s": 640.0, "tokens_per_s": 0.0})
        'step 10/100 | loss 2.5000 | lr 1.00e-03 | grad_norm 0.500 | 640 samples/s'
    """
    return (
        f"step {step}/{total} | loss {metrics['loss']:.4f} | lr {metrics['lr']:.2e} | "
        f"grad_norm {metrics['grad_norm']:.3f} | "
        f"{metrics['global_samples_per_s']:.0f} samples/s"
        + (f" | {metrics['global_tokens_per_s']:.0f} tok/s" if metrics["tokens_per_s"] else "")
        + (f" | MFU {metrics['mfu']:.1%}" if "mfu" in metrics else "")
    )


@contextlib.contextmanager
def progress_bar(total: int, start: int, *, enabled: bool) -> Iterator[Callable[[], None]]:
    """A transient rich progress bar when ``enabled`` and attached to a terminal.

    Yields:
        A function that advances the bar by one step (a no-op without a bar).
    """
    if not (enabled and sys.stdout.isatty()):
        yield lambda: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        bar = progress.add_task("training", total=total, completed=start)
        yield lambda: progress.advance(bar)


class MetricsWriter:
    """Append-only metrics on rank 0: ``metrics.jsonl``, TensorBoard events, and trackers.

    A run that crashed after its last checkpoint had logged steps it will train again. With
    ``resume_step`` the file is first cut back to the records of steps ``<= resume_step``
    (rewritten atomically) and TensorBoard hides its later events (``purge_step``), so every
    step appears once, whatever the number of restarts. Trackers that continue a kept run
    skip the steps the file dropped (they cannot take values back).

    Args:
        output_dir: Where ``metrics.jsonl`` (and ``tensorboard/``, ``wandb/``, ``mlruns/``)
            go; created if missing.
        tensorboard: Also write TensorBoard scalars when the package is importable.
        enabled: False on ranks other than 0: every method is then a no-op.
        resume_step: The step the run continues from (0 for a fresh start), or None to
            append to the file as it is.
        trackers: ``run.trackers``: ``wandb`` and ``mlflow`` entries are started here
            (:func:`~gpu_training.trackers.open_trackers`); ``jsonl`` and ``tensorboard``
            entries are this writer's own outputs (``tensorboard`` is the switch for those).
        params: The trackers' run parameters (``{"job": ..., "environment": ...}``).
        run_ids: Tracker run ids kept in the checkpoint being resumed: those runs continue.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        *,
        tensorboard: bool = True,
        enabled: bool = True,
        resume_step: int | None = None,
        trackers: Sequence[TrackerSpec] = (),
        params: Mapping[str, Any] | None = None,
        run_ids: Mapping[str, str] | None = None,
    ) -> None:
        self.enabled = enabled
        self.path = Path(output_dir) / "metrics.jsonl"
        self._tb: Any = None
        self._trackers: TrackerSet | None = None
        self._kept_ids = dict(run_ids or {})
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        dropped: dict[str, int] = {}
        if resume_step is not None:
            dropped = _truncate_after(self.path, resume_step)
        self._file = self.path.open("a", encoding="utf-8")
        _note_event(self.path.parent, "resume" if resume_step else "start", resume_step or 0)
        if any(t.name not in ("jsonl", "tensorboard") for t in trackers):
            from gpu_training.trackers import TrackerStart, open_trackers

            start = TrackerStart(
                output_dir=Path(output_dir),
                params=dict(params or {}),
                run_ids=self._kept_ids,
                logged_through=dropped,
            )
            self._trackers = open_trackers(trackers, start)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # the tensorboard extra is not installed
                self._tb = None
            else:
                self._tb = SummaryWriter(
                    log_dir=str(Path(output_dir) / "tensorboard"),
                    purge_step=None if resume_step is None else resume_step + 1,
                )

    @property
    def tensorboard_dir(self) -> Path | None:
        """The TensorBoard log directory, when events are written."""
        return Path(self._tb.log_dir) if self._tb is not None else None

    @property
    def run_ids(self) -> dict[str, str]:
        """Tracker name -> run id, to keep in checkpoints (the kept ones on other ranks)."""
        return self._trackers.run_ids if self._trackers is not None else dict(self._kept_ids)

    @property
    def trackers(self) -> str:
        """The started trackers and where each writes (``""`` when none)."""
        return self._trackers.describe() if self._trackers is not None else ""

    def write(self, split: str, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` of ``split`` (``train``/``val``) at optimizer step ``step``."""
        if not self.enabled:
            return
        record = {"split": split, "step": step}
        record.update({k: float(v) for k, v in values.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in values.items():
                if math.isfinite(float(value)):
                    self._tb.add_scalar(f"{split}/{key}", float(value), step)
        if self._trackers is not None:
            self._trackers.log(split, step, {k: float(v) for k, v in values.items()})

    def close(self, error: BaseException | None = None) -> None:
        """Flush and close the file, the TensorBoard writer and the trackers' runs.

        Args:
            error: What stopped the run, marked on the trackers' runs (default: the
                exception in flight, when called from a ``finally`` block).
        """
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._trackers is not None:
            # The Trainer closes in a `finally`: an exception in flight is why the run stopped.
            self._trackers.close(error if error is not None else sys.exc_info()[1])

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(exc)


def _note_event(directory: Path, event: str, step: int) -> None:
    """One line in ``events.jsonl``: the run started or resumed (``gpu-training report``)."""
    from datetime import datetime, timezone

    record = {"event": event, "step": step, "time": datetime.now(timezone.utc).isoformat()}
    with (directory / "events.jsonl").open("a", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")


def _truncate_after(path: Path, step: int) -> dict[str, int]:
    """Keeps the records of steps ``<= step`` (and drops a torn last line); atomic.

    Returns:
        Split -> the highest step dropped (what a killed run had logged past ``step``).
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    kept = []
    dropped: dict[str, int] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a kill
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            continue
        if record["step"] <= step:
            kept.append(line)
        else:
            split = str(record.get("split"))
            dropped[split] = max(dropped.get(split, step), record["step"])
    if len(kept) == len(lines):
        return dropped
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)
    return dropped


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (a torn last line, from a kill, is skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def plot_metrics(
    metrics_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    baseline: float | None = None,
) -> Path | None:
    """Draw train/validation loss (and throughput when logged) to a PNG.

    Args:
        metrics_path: A ``metrics.jsonl`` written by :class:`MetricsWriter`.
        out_path: The PNG to write (replaced atomically).
        baseline: A reference loss to draw as a horizontal line (e.g. the unigram baseline).

    Returns:
        The PNG path, or None when matplotlib (the ``plot`` extra) is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: render to a file
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    records = read_metrics(metrics_path)
    # A resumed run appends: keep the last record per (split, step).
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        latest[(r["split"], r["step"])] = r
    train = sorted((r for (s, _), r in latest.items() if s == "train"), key=lambda r: r["step"])
    val = sorted((r for (s, _), r in latest.items() if s == "val"), key=lambda r: r["step"])
    throughput = [r for r in train if "samples_per_s" in r]
    fig, axes = plt.subplots(1, 2 if throughput else 1, figsize=(11 if throughput else 6, 4))
    loss_ax = axes[0] if throughput else axes
    if train:
        loss_ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
    if val:
        loss_ax.plot([r["step"] for r in val], [r["loss"] for r in val], "o-", label="validation")
    if baseline is not None:
        loss_ax.axhline(baseline, color="gray", linestyle="--", label=f"baseline {baseline:.3f}")
    loss_ax.set_xlabel("optimizer step")
    loss_ax.set_ylabel("loss")
    loss_ax.legend()
    loss_ax.set_title("loss")
    if throughput:
        # job-wide when logged (the Trainer logs both); older files have one global figure
        rates = [r.get("global_samples_per_s", r["samples_per_s"]) for r in throughput]
        axes[1].plot([r["step"] for r in throughput], rates)
        axes[1].set_xlabel("optimizer step")
        axes[1].set_ylabel("samples / s (all ranks)")
        axes[1].set_title("throughput")
    fig.tight_layout()
    out = Path(out_path)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out)
    return out
