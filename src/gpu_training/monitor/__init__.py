"""What the GPUs are doing: NVML (or ``nvidia-smi``) queries and rules for what looks wrong.

The guide's loop::

    from gpu_training.monitor import query_nvidia_smi, detect_anomalies

    states = query_nvidia_smi()
    for s in states:
        print(s.summary_line())
    for a in detect_anomalies(states):
        print(f"[{a.severity}] {a.message}")

:func:`query_gpus` uses NVML through ``nvidia-ml-py`` (the ``monitor`` extra) and falls back
to ``nvidia-smi --query-gpu`` CSV; :func:`query_nvidia_smi` always uses ``nvidia-smi``. Both
parse into :class:`GPUState`, and the parsers take recorded text or values, so the rules are
tested without a GPU. No torch import.

The package: :mod:`~gpu_training.monitor.state` (:class:`GPUState`),
:mod:`~gpu_training.monitor.query` (NVML, ``nvidia-smi`` and CSV parsing) and
:mod:`~gpu_training.monitor.anomalies` (the rules); everything public is re-exported here.

Example:
    >>> csv = "0, GPU-a, NVIDIA H100 80GB HBM3, 98, 40, 78000, 81559, 71, 690.1, 700.0, " \\
    ...       "1980, 1980, 0x0000000000000000, 0, 0"
    >>> (state,) = parse_gpu_csv(csv)
    >>> print(state.summary_line())
    GPU 0 NVIDIA H100 80GB HBM3 | util  98% | mem 76.2/79.6 GiB ( 96%) | 71°C | 690/700 W
    >>> [a.rule for a in detect_anomalies([state])]
    ['memory_near_full']
"""

from __future__ import annotations

from gpu_training.monitor.anomalies import (
    SEVERITIES,
    Anomaly,
    MonitorThresholds,
    detect_anomalies,
    states_to_json,
)
from gpu_training.monitor.query import (
    APP_FIELDS,
    GPU_FIELDS,
    NoGPUError,
    parse_apps_csv,
    parse_gpu_csv,
    query_gpus,
    query_nvidia_smi,
    query_nvml,
)
from gpu_training.monitor.state import THROTTLE_REASONS, GPUProcess, GPUState

__all__ = [
    "APP_FIELDS",
    "GPU_FIELDS",
    "SEVERITIES",
    "THROTTLE_REASONS",
    "Anomaly",
    "GPUProcess",
    "GPUState",
    "MonitorThresholds",
    "NoGPUError",
    "detect_anomalies",
    "parse_apps_csv",
    "parse_gpu_csv",
    "query_gpus",
    "query_nvidia_smi",
    "query_nvml",
    "states_to_json",
]
