"""Per-rank step telemetry: what each rank's steps are made of, and which rank holds the job back.

Every rank of a Trainer run (``run.telemetry: true``, the default) appends one record per
optimizer step to its own ``<run dir>/telemetry/rank<N>.jsonl``: its wait for data, forward
and backward compute, its arrival at the step's first gradient collective, the time with a
collective in flight, the optimizer step, a save, and its memory. ``gpu-training watch
RUN_DIR`` reads those files (and ``metrics.jsonl``) without joining the job.

The package: :mod:`~gpu_training.telemetry.records` (the records, the files, the straggler
verdict; no torch) and :mod:`~gpu_training.telemetry.recorder` (:class:`RankTelemetry`, the
marks and the collective hooks); everything public is re-exported here.

Example:
    >>> waits = [StepRecord(step=1, step_ms=160, data_ms=151, arrival_ms=152)]
    >>> on_time = [StepRecord(step=1, step_ms=160, data_ms=0.5, arrival_ms=2)]
    >>> straggler({0: on_time, 1: waits}).message
    'rank 1 arrives 150 ms late: its data loading'
"""

from __future__ import annotations

from gpu_training.telemetry.recorder import OFF, RankTelemetry, TelemetryOff, open_telemetry
from gpu_training.telemetry.records import (
    TELEMETRY_DIR,
    RankLog,
    StepRecord,
    Straggler,
    rank_file,
    read_rank_logs,
    straggler,
)

__all__ = [
    "OFF",
    "TELEMETRY_DIR",
    "RankLog",
    "RankTelemetry",
    "StepRecord",
    "Straggler",
    "TelemetryOff",
    "open_telemetry",
    "rank_file",
    "read_rank_logs",
    "straggler",
]
