"""Rules for what looks wrong on a machine's GPUs, and a snapshot as JSON.

:func:`detect_anomalies` checks :class:`~gpu_training.monitor.GPUState` objects one by one
(memory near full, thermal or power throttling, ECC errors) and across the machine (every
process on GPU 0, idle GPUs next to busy ones, a utilisation straggler), with the lines drawn
by :class:`MonitorThresholds`, and returns :class:`Anomaly` objects, most severe
(:data:`SEVERITIES`) first. :func:`states_to_json` writes a snapshot and its anomalies as one
JSON document. No torch import.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpu_training.monitor.state import GPUState

__all__ = ["SEVERITIES", "Anomaly", "MonitorThresholds", "detect_anomalies", "states_to_json"]

SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")
"""Most severe first."""


@dataclass(frozen=True)
class Anomaly:
    """Something that looks wrong, how bad it is, and which GPUs."""

    severity: str
    """``critical``, ``warning`` or ``info``."""
    rule: str
    """Which rule fired (``memory_near_full``, ``thermal_throttle``, ...)."""
    message: str
    gpus: tuple[int, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {**asdict(self), "gpus": list(self.gpus)}


@dataclass(frozen=True)
class MonitorThresholds:
    """Where the rules draw their lines."""

    memory_warning: float = 0.95
    """Used / total memory at which ``memory_near_full`` warns."""
    memory_critical: float = 0.99
    busy_utilization: float = 50.0
    """A GPU at or above this utilisation is working."""
    idle_utilization: float = 5.0
    """A GPU at or below this utilisation (and without processes) is idle."""
    imbalance_points: float = 40.0
    """Utilisation spread (percentage points) across a job's GPUs that flags a straggler."""
    in_use_memory: float = 0.10
    """Without process information, a GPU with this share of memory used is in use."""


def _span(indices: Iterable[int]) -> str:
    ordered = sorted(indices)
    return ", ".join(str(i) for i in ordered)


def _in_use(state: GPUState, t: MonitorThresholds) -> bool:
    if state.processes is not None:
        return bool(state.processes)
    fraction = state.memory_fraction
    return fraction is not None and fraction >= t.in_use_memory


def detect_anomalies(
    states: Sequence[GPUState], thresholds: MonitorThresholds | None = None
) -> list[Anomaly]:
    """Check GPU states against the rules; most severe first.

    - ``memory_near_full``: memory at 95% (warning) or 99% (critical) of the total;
    - ``thermal_throttle`` / ``power_throttle``: clocks held down by temperature or power
      (hardware slowdowns are critical, software caps warnings);
    - ``ecc_errors``: uncorrected (critical) or corrected (warning) memory errors;
    - ``all_on_gpu0``: every process on GPU 0 while the other GPUs have none (ranks that
      never called ``torch.cuda.set_device``), or extra processes on GPU 0 (stray contexts);
    - ``idle_gpus``: some GPUs idle while others work (``--nproc_per_node`` below the GPU
      count, ``CUDA_VISIBLE_DEVICES``);
    - ``utilization_imbalance``: a wide utilisation spread across the GPUs a job uses (a
      straggler that every all-reduce waits for, or an uneven data split).

    Args:
        states: One state per GPU of the machine.
        thresholds: Where the rules draw their lines.

    Returns:
        The anomalies found; an empty list for a healthy machine.

    Example:
        >>> from gpu_training.monitor import GPUProcess, GPUState
        >>> busy = GPUState(0, "A100", utilization_gpu=97, memory_used=40 * 2**30,
        ...                 memory_total=80 * 2**30, processes=(GPUProcess(11),))
        >>> idle = GPUState(1, "A100", utilization_gpu=0, memory_used=2**20,
        ...                 memory_total=80 * 2**30, processes=())
        >>> [f"[{a.severity}] {a.rule}" for a in detect_anomalies([busy, idle])]
        ['[warning] idle_gpus']
    """
    t = thresholds or MonitorThresholds()
    found: list[Anomaly] = []
    for s in states:
        found += _per_gpu(s, t)
    found += _across_gpus(list(states), t)
    return sorted(found, key=lambda a: SEVERITIES.index(a.severity))


def _per_gpu(s: GPUState, t: MonitorThresholds) -> list[Anomaly]:
    out = []
    fraction = s.memory_fraction
    if fraction is not None and fraction >= t.memory_warning:
        severity = "critical" if fraction >= t.memory_critical else "warning"
        out.append(
            Anomaly(
                severity,
                "memory_near_full",
                f"GPU {s.index}: memory {fraction:.1%} full ({(s.memory_used or 0) / 2**30:.1f} "
                f"of {(s.memory_total or 0) / 2**30:.1f} GiB): the next larger batch or "
                "fragmentation will run out; see `gpu-training plan` and explain_oom()",
                (s.index,),
            )
        )
    names = set(s.throttle_names)
    clocks = ""
    if s.sm_clock_mhz and s.max_sm_clock_mhz:
        clocks = f" (SM clock {s.sm_clock_mhz:.0f} of {s.max_sm_clock_mhz:.0f} MHz)"
    temp = f" at {s.temperature_c:.0f}°C" if s.temperature_c is not None else ""
    if names & {"hw_thermal_slowdown", "sw_thermal_slowdown"} or (
        "hw_slowdown" in names and "hw_power_brake_slowdown" not in names
    ):
        hw = bool(names & {"hw_thermal_slowdown", "hw_slowdown"})
        out.append(
            Anomaly(
                "critical" if hw else "warning",
                "thermal_throttle",
                f"GPU {s.index}: thermal throttling{temp}{clocks}: check cooling and airflow; "
                "it slows every rank that waits for it",
                (s.index,),
            )
        )
    if names & {"sw_power_cap", "hw_power_brake_slowdown"}:
        hw = "hw_power_brake_slowdown" in names
        power = ""
        if s.power_draw_w is not None and s.power_limit_w:
            power = f" ({s.power_draw_w:.0f} of {s.power_limit_w:.0f} W)"
        out.append(
            Anomaly(
                "critical" if hw else "warning",
                "power_throttle",
                f"GPU {s.index}: "
                + (
                    "hardware power brake (PSU or board fault)"
                    if hw
                    else "clocks capped by the power limit"
                )
                + f"{power}{clocks}",
                (s.index,),
            )
        )
    if s.ecc_uncorrected:
        out.append(
            Anomaly(
                "critical",
                "ecc_errors",
                f"GPU {s.index}: {s.ecc_uncorrected} uncorrected ECC error(s): results may be "
                "corrupt; drain the node and reset or replace the GPU",
                (s.index,),
            )
        )
    elif s.ecc_corrected:
        out.append(
            Anomaly(
                "warning",
                "ecc_errors",
                f"GPU {s.index}: {s.ecc_corrected} corrected ECC error(s) since the driver "
                "loaded: watch for growth (failing memory)",
                (s.index,),
            )
        )
    return out


def _across_gpus(states: list[GPUState], t: MonitorThresholds) -> list[Anomaly]:
    if len(states) < 2:
        return []
    out = []
    gpu0 = next((s for s in states if s.index == 0), None)
    others = [s for s in states if s.index != 0]
    known = gpu0 is not None and gpu0.processes is not None
    known = known and all(s.processes is not None for s in others)
    all_on_0 = False
    if known and gpu0 is not None and gpu0.processes:
        on_0 = len(gpu0.processes)
        elsewhere = [len(s.processes or ()) for s in others]
        if on_0 >= 2 and not any(elsewhere):
            all_on_0 = True
            out.append(
                Anomaly(
                    "critical",
                    "all_on_gpu0",
                    f"all {on_0} processes are on GPU 0 and GPUs {_span(s.index for s in others)} "
                    "have none: each rank must call torch.cuda.set_device(local_rank) "
                    "(init_distributed does) before touching CUDA",
                    (0,),
                )
            )
        elif any(elsewhere) and on_0 > max(elsewhere):
            out.append(
                Anomaly(
                    "warning",
                    "all_on_gpu0",
                    f"GPU 0 runs {on_0} processes, the others at most {max(elsewhere)}: ranks "
                    "create stray CUDA contexts on GPU 0 (~500 MB each); set the device before "
                    "any CUDA call",
                    (0,),
                )
            )
    util = {s.index: s.utilization_gpu for s in states if s.utilization_gpu is not None}
    busy = [i for i, u in util.items() if u >= t.busy_utilization]
    idle = [
        s.index
        for s in states
        if s.index in util
        and util[s.index] <= t.idle_utilization
        and not s.processes
        and (s.processes is not None or (s.memory_fraction or 0) < t.in_use_memory)
    ]
    if busy and idle and not all_on_0:
        out.append(
            Anomaly(
                "warning",
                "idle_gpus",
                f"GPUs {_span(idle)} idle while GPUs {_span(busy)} work: --nproc_per_node "
                "below the GPU count, or CUDA_VISIBLE_DEVICES hides them",
                tuple(sorted(idle)),
            )
        )
    job = [s for s in states if _in_use(s, t) and s.utilization_gpu is not None]
    if len(job) >= 2:
        values = {s.index: float(s.utilization_gpu or 0) for s in job}
        top = max(values.values())
        median = statistics.median(values.values())
        laggards = [i for i, u in values.items() if top - u >= t.imbalance_points]
        if laggards and top >= t.busy_utilization:
            listed = ", ".join(f"GPU {i} at {values[i]:.0f}%" for i in sorted(laggards))
            out.append(
                Anomaly(
                    "warning",
                    "utilization_imbalance",
                    f"utilisation imbalance across the job's GPUs: {listed}, median "
                    f"{median:.0f}%, top {top:.0f}%: a straggler (throttled or slower GPU, "
                    "starved data loader) or an uneven split holds back every all-reduce",
                    tuple(sorted(laggards)),
                )
            )
    return out


def states_to_json(states: Sequence[GPUState], anomalies: Sequence[Anomaly]) -> str:
    """One JSON document: ``{"gpus": [...], "anomalies": [...]}``."""
    return json.dumps(
        {"gpus": [s.to_dict() for s in states], "anomalies": [a.to_dict() for a in anomalies]}
    )
