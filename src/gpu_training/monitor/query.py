"""Reading the GPUs: NVML, ``nvidia-smi``, and parsers for recorded ``nvidia-smi`` CSV.

:func:`query_gpus` uses NVML through ``nvidia-ml-py`` (the ``monitor`` extra) and falls back
to ``nvidia-smi --query-gpu`` CSV (:data:`GPU_FIELDS`, with the compute processes from
``--query-compute-apps``, :data:`APP_FIELDS`); :func:`query_nvidia_smi` always uses
``nvidia-smi``, :func:`query_nvml` only NVML. All return :class:`~gpu_training.monitor.GPUState`
objects and raise :class:`NoGPUError` when they see no GPU. The parsers take recorded text
(and :func:`query_nvml` a stand-in for ``pynvml``), so everything is tested without a GPU.
No torch import.

Example:
    >>> line = "0, GPU-a, NVIDIA A100-SXM4-80GB, 35, 10, [N/A], 81920, 44, 90.5, 400.0, " \\
    ...       "1410, 1410, 0x0000000000000004, 0, 0"
    >>> (state,) = parse_gpu_csv(line)
    >>> state.memory_used is None, state.memory_total == 80 * 2**30, state.throttle_names
    (True, True, ('sw_power_cap',))
"""

from __future__ import annotations

import contextlib
import csv
import io
import shutil
import subprocess
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from gpu_training.monitor.state import GPUProcess, GPUState

__all__ = [
    "APP_FIELDS",
    "GPU_FIELDS",
    "NoGPUError",
    "parse_apps_csv",
    "parse_gpu_csv",
    "query_gpus",
    "query_nvidia_smi",
    "query_nvml",
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

_MIB = 2**20


class NoGPUError(RuntimeError):
    """Neither NVML nor ``nvidia-smi`` can see an NVIDIA GPU."""


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


def with_processes(
    states: list[GPUState], apps: Mapping[str, tuple[GPUProcess, ...]]
) -> list[GPUState]:
    """``states`` with each GPU's compute processes from ``apps`` (:func:`parse_apps_csv`)."""
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
    return with_processes(states, parse_apps_csv(apps))


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
