"""One GPU at one moment: :class:`GPUState`, its compute processes, and the throttle bits.

:class:`GPUState` is what every query of :mod:`gpu_training.monitor.query` returns and what
the rules of :mod:`gpu_training.monitor.anomalies` read: utilisation, memory, temperature,
power, clocks, throttle reasons (:data:`THROTTLE_REASONS`), ECC counters and the compute
processes (:class:`GPUProcess`), each None when the driver does not report it. Plain data, no
torch and no driver calls.

Example:
    >>> gpu = GPUState(3, "NVIDIA H100 80GB HBM3", utilization_gpu=91, throttle_reasons=0x40)
    >>> gpu.throttle_names
    ('hw_thermal_slowdown',)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["THROTTLE_REASONS", "GPUProcess", "GPUState"]

THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""NVML's clock-throttle (``clocks_event_reasons``) bits."""


@dataclass(frozen=True)
class GPUProcess:
    """A compute process using a GPU."""

    pid: int
    name: str = ""
    used_memory: int | None = None
    """Bytes (None when the driver does not say, e.g. inside some containers)."""


@dataclass(frozen=True)
class GPUState:
    """One GPU at one moment. A field the driver does not report is None."""

    index: int
    name: str
    uuid: str = ""
    utilization_gpu: float | None = None
    """Percent of the sample period a kernel was running."""
    utilization_memory: float | None = None
    memory_used: int | None = None
    """Bytes."""
    memory_total: int | None = None
    """Bytes."""
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    throttle_reasons: int | None = None
    """Bitmask of :data:`THROTTLE_REASONS`."""
    ecc_corrected: int | None = None
    """Corrected ECC errors since the driver loaded (volatile)."""
    ecc_uncorrected: int | None = None
    processes: tuple[GPUProcess, ...] | None = None
    """Compute processes on this GPU; None when unknown."""

    @property
    def memory_fraction(self) -> float | None:
        """Used / total memory."""
        if self.memory_used is None or not self.memory_total:
            return None
        return self.memory_used / self.memory_total

    @property
    def throttle_names(self) -> tuple[str, ...]:
        """Names of the active throttle reasons (idle excluded)."""
        bits = self.throttle_reasons or 0
        return tuple(name for bit, name in THROTTLE_REASONS.items() if bits & bit and bit != 0x1)

    def summary_line(self) -> str:
        """One line for a log: index, name, utilisation, memory, temperature, power.

        Example:
            >>> GPUState(1, "NVIDIA A100-SXM4-80GB", utilization_gpu=3).summary_line()
            'GPU 1 NVIDIA A100-SXM4-80GB | util   3%'
        """
        parts = [f"GPU {self.index} {self.name}"]
        if self.utilization_gpu is not None:
            parts.append(f"util {self.utilization_gpu:3.0f}%")
        fraction = self.memory_fraction
        if fraction is not None:
            assert self.memory_used is not None and self.memory_total is not None
            parts.append(
                f"mem {self.memory_used / 2**30:.1f}/{self.memory_total / 2**30:.1f} GiB "
                f"({fraction:4.0%})"
            )
        if self.temperature_c is not None:
            parts.append(f"{self.temperature_c:.0f}°C")
        if self.power_draw_w is not None:
            limit = f"/{self.power_limit_w:.0f}" if self.power_limit_w else ""
            parts.append(f"{self.power_draw_w:.0f}{limit} W")
        if self.processes:
            parts.append(f"{len(self.processes)} proc")
        if self.throttle_names:
            parts.append("throttled: " + ",".join(self.throttle_names))
        return " | ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``throttle_names`` and ``memory_fraction`` included)."""
        data = asdict(self)
        data["throttle_names"] = list(self.throttle_names)
        data["memory_fraction"] = self.memory_fraction
        return data
