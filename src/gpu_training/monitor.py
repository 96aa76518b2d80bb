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

import contextlib
import csv
import io
import json
import shutil
import statistics
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

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

GPU_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.max.sm",
    "clocks_throttle_reasons.active",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
)
"""``nvidia-smi --query-gpu`` fields, in the column order :func:`parse_gpu_csv` expects."""

APP_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "process_name", "used_memory")
"""``nvidia-smi --query-compute-apps`` fields, in the order :func:`parse_apps_csv` expects."""

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

SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")
"""Most severe first."""

_MIB = 2**20


class NoGPUError(RuntimeError):
    """Neither NVML nor ``nvidia-smi`` can see an NVIDIA GPU."""


# --- state -----------------------------------------------------------------------------------


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


# --- nvidia-smi --------------------------------------------------------------------------------


def _value(text: str) -> str | None:
    text = text.strip()
    if not text or text.strip("[]") in ("N/A", "Not Supported", "Unknown Error", "Unknown"):
        return None
    return text


def _float(text: str) -> float | None:
    value = _value(text)
    return float(value) if value is not None else None


def _int(text: str) -> int | None:
    value = _value(text)
    if value is None:
        return None
    return int(value, 16) if value.lower().startswith("0x") else int(float(value))


def _mib(text: str) -> int | None:
    value = _float(text)
    return round(value * _MIB) if value is not None else None


def _rows(text: str) -> list[list[str]]:
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if any(r)]
    if rows and rows[0][0].strip().lower() in ("index", "gpu_uuid"):
        rows = rows[1:]  # the header of --format=csv (without noheader)
    return rows


def parse_gpu_csv(text: str) -> list[GPUState]:
    """GPU states from ``nvidia-smi --query-gpu=<GPU_FIELDS> --format=csv[,noheader],nounits``.

    ``[N/A]`` and ``[Not Supported]`` become None; a header line is skipped.

    Raises:
        ValueError: If a row does not have one column per :data:`GPU_FIELDS`.
    """
    states = []
    for row in _rows(text):
        if len(row) != len(GPU_FIELDS):
            raise ValueError(
                f"nvidia-smi row has {len(row)} columns, expected {len(GPU_FIELDS)}: {row!r}"
            )
        v = dict(zip(GPU_FIELDS, row, strict=True))
        states.append(
            GPUState(
                index=int(v["index"]),
                name=v["name"].strip(),
                uuid=v["uuid"].strip(),
                utilization_gpu=_float(v["utilization.gpu"]),
                utilization_memory=_float(v["utilization.memory"]),
                memory_used=_mib(v["memory.used"]),
                memory_total=_mib(v["memory.total"]),
                temperature_c=_float(v["temperature.gpu"]),
                power_draw_w=_float(v["power.draw"]),
                power_limit_w=_float(v["power.limit"]),
                sm_clock_mhz=_float(v["clocks.sm"]),
                max_sm_clock_mhz=_float(v["clocks.max.sm"]),
                throttle_reasons=_int(v["clocks_throttle_reasons.active"]),
                ecc_corrected=_int(v["ecc.errors.corrected.volatile.total"]),
                ecc_uncorrected=_int(v["ecc.errors.uncorrected.volatile.total"]),
            )
        )
    return states


def parse_apps_csv(text: str) -> dict[str, tuple[GPUProcess, ...]]:
    """Processes per GPU UUID from ``nvidia-smi --query-compute-apps=<APP_FIELDS>`` CSV.

    Raises:
        ValueError: If a row does not have one column per :data:`APP_FIELDS`.
    """
    found: dict[str, list[GPUProcess]] = {}
    for row in _rows(text):
        if len(row) != len(APP_FIELDS):
            raise ValueError(f"nvidia-smi apps row has {len(row)} columns: {row!r}")
        uuid, pid, name, used = (c.strip() for c in row)
        found.setdefault(uuid, []).append(GPUProcess(int(pid), name, _mib(used)))
    return {uuid: tuple(procs) for uuid, procs in found.items()}


def _with_processes(
    states: list[GPUState], apps: Mapping[str, tuple[GPUProcess, ...]]
) -> list[GPUState]:
    from dataclasses import replace

    return [replace(s, processes=apps.get(s.uuid, ())) for s in states]


def _smi(args: list[str], timeout: float) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise NoGPUError("nvidia-smi: not found")
    proc = subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        message = " ".join((proc.stdout + proc.stderr).split()) or f"exit {proc.returncode}"
        raise NoGPUError(f"nvidia-smi: {message}")
    return proc.stdout


def query_nvidia_smi(timeout: float = 10.0) -> list[GPUState]:
    """Every GPU's state (and its compute processes) from ``nvidia-smi``.

    Raises:
        NoGPUError: ``nvidia-smi`` is missing or fails (no driver, no GPU).
    """
    fields = list(GPU_FIELDS)
    try:
        text = _smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"], timeout)
    except NoGPUError as err:
        if "not a valid field" not in str(err):
            raise
        # Drivers from 2023 on name it clocks_event_reasons; older ones only the old name.
        fields[GPU_FIELDS.index("clocks_throttle_reasons.active")] = "clocks_event_reasons.active"
        text = _smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"], timeout)
    states = parse_gpu_csv(text)
    if not states:
        raise NoGPUError("nvidia-smi: no GPU listed")
    try:
        apps = _smi(
            [f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"],
            timeout,
        )
    except NoGPUError:
        return states
    return _with_processes(states, parse_apps_csv(apps))


# --- NVML ------------------------------------------------------------------------------------


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise NoGPUError("NVML: nvidia-ml-py is not installed") from None
    return pynvml


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def query_nvml(nvml: ModuleType | Any | None = None) -> list[GPUState]:
    """Every GPU's state from NVML (``pip install nvidia-ml-py``, the ``monitor`` extra).

    Args:
        nvml: The ``pynvml`` module, or an object with the same functions (tests pass one
            that replays recorded values).

    Raises:
        NoGPUError: NVML is missing, fails to initialise, or sees no GPU.
    """
    lib: Any = nvml if nvml is not None else _import_pynvml()
    error = getattr(lib, "NVMLError", Exception)
    try:
        lib.nvmlInit()
    except error as err:
        raise NoGPUError(f"NVML: {err}") from None
    try:
        count = lib.nvmlDeviceGetCount()
        if count == 0:
            raise NoGPUError("NVML: no GPU found")

        def get(fn: str, *args: Any) -> Any:
            try:
                return getattr(lib, fn)(*args)
            except error:  # not supported on this GPU / driver
                return None

        states = []
        for index in range(count):
            h = lib.nvmlDeviceGetHandleByIndex(index)
            util = get("nvmlDeviceGetUtilizationRates", h)
            mem = get("nvmlDeviceGetMemoryInfo", h)
            power = get("nvmlDeviceGetPowerUsage", h)
            limit = get("nvmlDeviceGetEnforcedPowerLimit", h)
            procs = get("nvmlDeviceGetComputeRunningProcesses", h)
            states.append(
                GPUState(
                    index=index,
                    name=_text(lib.nvmlDeviceGetName(h)),
                    uuid=_text(get("nvmlDeviceGetUUID", h) or ""),
                    utilization_gpu=float(util.gpu) if util is not None else None,
                    utilization_memory=float(util.memory) if util is not None else None,
                    memory_used=int(mem.used) if mem is not None else None,
                    memory_total=int(mem.total) if mem is not None else None,
                    temperature_c=_num(get("nvmlDeviceGetTemperature", h, 0)),  # 0: GPU die
                    power_draw_w=power / 1000 if power is not None else None,  # milliwatts
                    power_limit_w=limit / 1000 if limit is not None else None,
                    sm_clock_mhz=_num(get("nvmlDeviceGetClockInfo", h, 1)),  # 1: SM clock
                    max_sm_clock_mhz=_num(get("nvmlDeviceGetMaxClockInfo", h, 1)),
                    throttle_reasons=get("nvmlDeviceGetCurrentClocksThrottleReasons", h),
                    # memory error type 0/1 = corrected/uncorrected, counter 0 = volatile
                    ecc_corrected=get("nvmlDeviceGetTotalEccErrors", h, 0, 0),
                    ecc_uncorrected=get("nvmlDeviceGetTotalEccErrors", h, 1, 0),
                    processes=None
                    if procs is None
                    else tuple(
                        GPUProcess(
                            int(p.pid),
                            _process_name(int(p.pid)),
                            int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                        )
                        for p in procs
                    ),
                )
            )
        return states
    finally:
        with contextlib.suppress(error):
            lib.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _num(value: Any) -> float | None:
    return float(value) if value is not None else None


def query_gpus(nvml: ModuleType | Any | None = None) -> list[GPUState]:
    """Every GPU's state: NVML when available, else ``nvidia-smi``.

    Raises:
        NoGPUError: Neither sees a GPU; the message gives both reasons.
    """
    try:
        return query_nvml(nvml)
    except NoGPUError as nvml_err:
        try:
            return query_nvidia_smi()
        except NoGPUError as smi_err:
            raise NoGPUError(f"no NVIDIA GPU found ({nvml_err}; {smi_err})") from None


# --- anomaly rules ---------------------------------------------------------------------------


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
