"""What ``gpu-training watch`` shows, read from a run directory's files: :func:`build_view`.

The rows come from each rank's ``telemetry/rank<N>.jsonl`` (:mod:`gpu_training.telemetry`),
loss and throughput from the Trainer's ``metrics.jsonl``, the last committed checkpoint from
the checkpoint directory, the price from the GPU table ``plan`` uses
(:data:`gpu_training.hardware.GPU_TYPES`). Nothing here joins the job or writes a file.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RankRow", "WatchView", "build_view", "price_for_device"]


@dataclass(frozen=True)
class RankRow:
    """One rank's recent steps: medians over the window, times in milliseconds."""

    rank: int
    step: int
    """Its newest recorded step."""
    step_ms: float
    data_ms: float
    compute_ms: float
    comm_ms: float
    optimizer_ms: float
    checkpoint_ms: float
    lag_ms: float | None
    """Its arrival at the first gradient collective behind the earliest rank's."""
    memory_bytes: int | None
    memory_kind: str
    age_s: float
    """Seconds since its newest record was written."""


@dataclass
class WatchView:
    """Everything one refresh of ``watch`` shows (``--json`` prints it as is)."""

    run_dir: str
    world_size: int
    strategy: str
    device_name: str
    step: int
    total_steps: int | None
    rows: list[RankRow]
    verdict: str
    straggler: dict[str, Any] = field(default_factory=dict)
    """``rank``, ``lag_ms``, ``cause`` (None when no rank stands out), ``steps`` read and
    ``lags_ms`` (every rank's)."""
    loss: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    eta_s: float | None = None
    elapsed_s: float | None = None
    """Since this launch started (the newest ``start`` record)."""
    price_per_gpu_hour: float | None = None
    cost_so_far: float | None = None
    """Dollars since this launch started, all GPUs, at :attr:`price_per_gpu_hour`."""
    checkpoint: str | None = None
    """The newest committed checkpoint."""
    stall: str | None = None
    """The watchdog's verdict, when a rank stalled and it recorded one."""

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return asdict(self)


_PRICE_KEYS = (
    ("h200", "h200"),
    ("h100", "h100"),
    ("a100", "a100-80gb"),  # refined below by memory size
    ("l40s", "l40s"),
    ("4090", "rtx4090"),
)


def price_for_device(device_name: str) -> float | None:
    """Dollars per GPU-hour for a CUDA device name, from the table ``plan`` prices with."""
    from gpu_training.hardware import GPU_TYPES

    name = device_name.lower()
    for fragment, key in _PRICE_KEYS:
        if fragment in name:
            if key == "a100-80gb" and "40gb" in name:
                key = "a100-40gb"
            return GPU_TYPES[key].price_per_gpu_hour
    return None


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _last_metrics(run_dir: Path) -> dict[str, Any]:
    from gpu_training.reporting import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    train = [r for r in read_metrics(path) if r.get("split") == "train"]
    return train[-1] if train else {}


def _latest_checkpoint(root: str | None) -> str | None:
    if not root or not Path(root).is_dir():
        return None
    from gpu_training.checkpoint import CheckpointDirectory

    latest = CheckpointDirectory(root).latest()
    return str(latest) if latest is not None else None


def _missing_ranks(logs: dict[int, Any], world: int) -> str | None:
    """The verdict while some ranks have written no step yet (starting, or stuck before one)."""
    silent = [r for r in range(world) if r not in logs or not logs[r].steps]
    if not silent:
        return None
    return f"no step recorded yet by rank(s) {', '.join(map(str, silent))} of {world}"


def build_view(run_dir: str | Path, *, steps: int = 5, now: float | None = None) -> WatchView:
    """One refresh of ``watch`` from the files under ``run_dir``.

    Args:
        run_dir: The run's output directory (``run.output_dir``).
        steps: How many recent steps the rows and the verdict read.
        now: The time to measure ages and ETAs from (default: now).

    Raises:
        UsageError: When ``run_dir`` is not a directory or holds no telemetry.
    """
    from gpu_training.cli import UsageError
    from gpu_training.telemetry import TELEMETRY_DIR, read_rank_logs, straggler

    root = Path(run_dir)
    if not root.is_dir():
        raise UsageError(f"watch: {run_dir} does not exist or is not a directory")
    logs = read_rank_logs(root)
    if not logs:
        raise UsageError(
            f"watch: no telemetry in {root / TELEMETRY_DIR} (a run of `gpu-training train` "
            "with run.telemetry on writes it; is this its run.output_dir?)"
        )
    now = time.time() if now is None else now
    records = {rank: log.steps for rank, log in logs.items()}
    verdict = straggler(records, steps=steps)
    start = max((log.start for log in logs.values()), key=lambda s: s.get("started", 0.0))
    rows: list[RankRow] = []
    for rank, log in sorted(logs.items()):
        recent = log.steps[-steps:]
        if not recent:
            continue

        def med(name: str, recent: list[Any] = recent) -> float:
            return _median([getattr(r, name) for r in recent])

        rows.append(
            RankRow(
                rank=rank,
                step=recent[-1].step,
                step_ms=med("step_ms"),
                data_ms=med("data_ms"),
                compute_ms=med("compute_ms"),
                comm_ms=med("comm_ms"),
                optimizer_ms=med("optimizer_ms"),
                checkpoint_ms=med("checkpoint_ms"),
                lag_ms=verdict.lags_ms.get(rank),
                memory_bytes=recent[-1].memory_bytes,
                memory_kind=recent[-1].memory_kind,
                age_s=max(now - recent[-1].time, 0.0),
            )
        )
    step = min((row.step for row in rows), default=0)
    total = start.get("total_steps")
    world = int(start.get("world_size") or len(logs))
    slowest = max((row.step_ms for row in rows), default=math.nan)
    eta = (total - step) * slowest / 1e3 if total and rows and slowest == slowest else None
    elapsed = now - start["started"] if "started" in start else None
    device_name = str(start.get("device_name", "?"))
    price = price_for_device(device_name) if device_name != "cpu" else None
    metrics = _last_metrics(root)
    launched = start.get("started", 0.0)  # a verdict of an earlier launch is stale
    stalls = [log.stall for log in logs.values() if log.stall and log.stall["time"] >= launched]
    return WatchView(
        run_dir=str(root),
        world_size=world,
        strategy=str(start.get("strategy", "?")),
        device_name=device_name,
        step=step,
        total_steps=total,
        rows=rows,
        verdict=_missing_ranks(logs, world) or verdict.message,
        straggler={
            "rank": verdict.rank,
            "lag_ms": verdict.lag_ms,
            "cause": verdict.cause,
            "steps": verdict.steps,
            "lags_ms": verdict.lags_ms,
        },
        loss=metrics.get("loss"),
        samples_per_s=metrics.get("global_samples_per_s"),
        tokens_per_s=metrics.get("global_tokens_per_s") or None,
        mfu=metrics.get("mfu"),
        eta_s=eta,
        elapsed_s=elapsed,
        price_per_gpu_hour=price,
        cost_so_far=(price * world * elapsed / 3600) if price and elapsed is not None else None,
        checkpoint=_latest_checkpoint(start.get("checkpoint_dir")),
        stall=max(stalls, key=lambda s: s.get("time", 0.0)).get("message") if stalls else None,
    )
