"""What each rank writes about its steps, where, and which rank holds the job back.

Every rank appends its own JSON lines to ``<run dir>/telemetry/rank<N>.jsonl``
(:func:`rank_file`): one ``start`` record when a run (or a resumed run) begins, then one
``step`` record per optimizer step (:class:`StepRecord`), written in batches at log steps a
second apart and before each checkpoint. A file per rank needs no collective and no shared
writer, so a rank that dies leaves all but its last second or so on disk; a resumed run
appends to the same files (the
reader keeps the newest record of a step). No torch here: ``gpu-training watch`` reads these
files without joining the job.

:func:`straggler` turns the last steps of every rank into a verdict in words: who *arrives*
late at the step's first gradient collective, by how much, and whether its data loading or its
compute made it late. Every rank's step time is the same in a synchronous job (the all-reduce
makes the fast ranks wait), so the arrival is what tells the ranks apart.

Example:
    >>> fast = [StepRecord(step=s, step_ms=160, data_ms=0.4, compute_ms=9, arrival_ms=2,
    ...                    comm_ms=150) for s in range(1, 6)]
    >>> slow = [StepRecord(step=s, step_ms=160, data_ms=0.4, compute_ms=159,
    ...                    arrival_ms=152, comm_ms=1) for s in range(1, 6)]
    >>> straggler({0: fast, 1: slow}).message
    'rank 1 arrives 150 ms late: its compute'
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = [
    "TELEMETRY_DIR",
    "RankLog",
    "StepRecord",
    "Straggler",
    "rank_file",
    "read_rank_logs",
    "step_line",
    "straggler",
]

TELEMETRY_DIR = "telemetry"
"""The folder under the run directory that holds one JSONL file per rank."""

_MIN_LAG_MS = 5.0
"""Below this, an arrival lag is noise on any machine (scheduling, a page fault)."""
_MIN_LAG_SHARE = 0.10
"""... and below this share of the step time it costs too little to name."""


def rank_file(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """``<run_dir>/telemetry/rank<rank>.jsonl``: the one file ``rank`` writes."""
    return Path(run_dir) / TELEMETRY_DIR / f"rank{rank}.jsonl"


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as one rank saw it; times in milliseconds.

    The parts are measured on the host clock without a device sync: ``data_ms`` (waiting for
    the loader), ``compute_ms`` (forward and backward with the time a collective was in flight
    taken out), ``comm_ms`` (time with a collective of this step in flight: the gradient
    all-reduce or reduce-scatter, FSDP's all-gathers, the loss's token count),
    ``optimizer_ms``, ``checkpoint_ms`` (a save after the step). ``step_ms`` runs from the
    step's first request to the loader to the next step's; what the parts leave is logging,
    evaluation and the loop.
    """

    step: int
    """The optimizer step this record closes (1 for the first)."""
    step_ms: float
    data_ms: float = 0.0
    compute_ms: float = 0.0
    arrival_ms: float | None = None
    """From the step's start to this rank's first gradient collective, less the time it spent
    in earlier collectives (waiting for other ranks): the rank's own work before it can sync.
    None where the strategy has no hook (DeepSpeed, one rank without a group)."""
    comm_ms: float = 0.0
    optimizer_ms: float = 0.0
    checkpoint_ms: float = 0.0
    memory_bytes: int | None = None
    """CUDA: peak allocated, read when the line was written; CPU: resident set size then."""
    memory_kind: str = ""
    """``cuda_peak`` or ``rss``."""
    time: float = 0.0
    """Unix time at the end of the step."""

    def to_json(self) -> dict[str, Any]:
        """The record as one JSON object (``kind: step``): :func:`step_line`'s, parsed."""
        data: dict[str, Any] = json.loads(
            step_line(
                self.step,
                self.step_ms,
                self.data_ms,
                self.compute_ms,
                self.arrival_ms,
                self.comm_ms,
                self.optimizer_ms,
                self.checkpoint_ms,
                self.time,
            )
        )
        return {**data, "memory_bytes": self.memory_bytes, "memory_kind": self.memory_kind}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepRecord:
        """The record from :meth:`to_json`'s object (unknown keys are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _ms(value: float | None) -> str:
    return "null" if value is None else f"{value:.3f}"


def step_line(
    step: int,
    step_ms: float,
    data_ms: float,
    compute_ms: float,
    arrival_ms: float | None,
    comm_ms: float,
    optimizer_ms: float,
    checkpoint_ms: float,
    time: float,
    *,
    tail: str = "",
) -> str:
    """One ``step`` record as a JSON line, times to the microsecond; ``tail`` adds fields.

    Formatted by hand: a recorder writes one per step, and ``json.dumps`` of a dict costs
    several times more per step than the rest of the telemetry together.

    Example:
        >>> line = step_line(3, 12.5, 0.25, 10.0, None, 1.0, 0.5, 0.0, 1700000000.0)
        >>> line[:63]
        '{"kind": "step", "step": 3, "step_ms": 12.500, "data_ms": 0.250'
        >>> StepRecord.from_json(json.loads(line)) == StepRecord(3, 12.5, 0.25, 10.0, None, 1.0,
        ...                                                      0.5, time=1700000000.0)
        True
    """
    return (
        f'{{"kind": "step", "step": {step}, "step_ms": {step_ms:.3f}, "data_ms": {data_ms:.3f}, '
        f'"compute_ms": {compute_ms:.3f}, "arrival_ms": {_ms(arrival_ms)}, '
        f'"comm_ms": {comm_ms:.3f}, "optimizer_ms": {optimizer_ms:.3f}, '
        f'"checkpoint_ms": {checkpoint_ms:.3f}, "time": {time:.3f}{tail}}}\n'
    )


@dataclass
class RankLog:
    """What one rank's file holds: its newest ``start`` record, its steps and any stall."""

    rank: int
    start: dict[str, Any] = field(default_factory=dict)
    """``world_size``, ``total_steps``, ``strategy``, ``device``, ``device_name``, ``started``
    (unix time), ``checkpoint_dir``, ``pid``, ``host``."""
    steps: list[StepRecord] = field(default_factory=list)
    """By step; a step written twice (a resume) keeps its newest record."""
    stall: dict[str, Any] | None = None
    """The watchdog's verdict, when it recorded one (``message``, ``time``)."""


def read_rank_logs(run_dir: str | os.PathLike[str]) -> dict[int, RankLog]:
    """Every rank's file under ``<run_dir>/telemetry``, by rank (empty if there is none).

    A torn last line (a rank killed mid-write) is skipped.
    """
    logs: dict[int, RankLog] = {}
    folder = Path(run_dir) / TELEMETRY_DIR
    for path in sorted(folder.glob("rank*.jsonl")) if folder.is_dir() else []:
        suffix = path.stem[len("rank") :]
        if not suffix.isdigit():
            continue
        rank = int(suffix)
        log = RankLog(rank)
        by_step: dict[int, StepRecord] = {}
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        for line in text.splitlines():
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(data, dict):
                continue
            kind = data.get("kind")
            if kind == "start":
                log.start = data
            elif kind == "stall":
                log.stall = data
            elif kind == "step":
                try:
                    record = StepRecord.from_json(data)
                except TypeError:
                    continue
                by_step[record.step] = record
        log.steps = [by_step[s] for s in sorted(by_step)]
        logs[rank] = log
    return logs


@dataclass(frozen=True)
class Straggler:
    """The verdict over the last steps: who arrives late, by how much, and why."""

    message: str
    """In words, e.g. ``rank 1 arrives 140 ms late: its data loading``."""
    rank: int | None = None
    """The late rank; None when no rank stands out (or it cannot be told)."""
    lag_ms: float = 0.0
    cause: str | None = None
    """``data loading`` or ``compute``."""
    lags_ms: dict[int, float] = field(default_factory=dict)
    """Every rank's median arrival lag behind the earliest rank."""
    steps: int = 0
    """How many recent steps the verdict reads."""


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def straggler(records: Mapping[int, Sequence[StepRecord]], *, steps: int = 5) -> Straggler:
    """Which rank holds the job back, over the last ``steps`` steps every rank recorded.

    A rank's lag is its median arrival at the first gradient collective behind the earliest
    rank's. The latest rank is named when its lag is at least 5 ms and 10% of the step time;
    the cause is its data loading when its data wait exceeds the earliest rank's by half the
    lag or more, else its compute.

    Args:
        records: Each rank's step records (any order).
        steps: How many of the newest common steps to read.
    """
    if len(records) < 2:
        return Straggler("one rank: no other rank to compare with")
    common = set.intersection(*(set(r.step for r in recs) for recs in records.values()))
    window = sorted(common)[-steps:]
    if not window:
        return Straggler("no step recorded by every rank yet")
    chosen = set(window)
    arrival: dict[int, float] = {}
    data: dict[int, float] = {}
    step_ms: list[float] = []
    for rank, recs in records.items():
        mine = [r for r in recs if r.step in chosen]
        arrivals = [r.arrival_ms for r in mine if r.arrival_ms is not None]
        if not arrivals:
            return Straggler("no arrival times (this strategy has no collective hook)")
        arrival[rank] = _median(arrivals)
        data[rank] = _median([r.data_ms for r in mine])
        step_ms.append(_median([r.step_ms for r in mine]))
    first = min(arrival, key=lambda r: arrival[r])
    lags = {r: arrival[r] - arrival[first] for r in sorted(arrival)}
    late = max(lags, key=lambda r: lags[r])
    lag = lags[late]
    typical = _median(step_ms)
    if lag < max(_MIN_LAG_MS, _MIN_LAG_SHARE * typical):
        return Straggler(
            f"no straggler: every rank arrives within {lag:.0f} ms of the first",
            lags_ms=lags,
            steps=len(window),
        )
    cause = "data loading" if data[late] - data[first] >= lag / 2 else "compute"
    return Straggler(
        f"rank {late} arrives {lag:.0f} ms late: its {cause}",
        rank=late,
        lag_ms=lag,
        cause=cause,
        lags_ms=lags,
        steps=len(window),
    )
