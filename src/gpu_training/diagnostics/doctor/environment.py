"""What ``gpu-training doctor`` looks at: the machine as this job will see it, in facts.

:func:`collect_facts` gathers the :class:`Facts`: Python, torch, CUDA, cuDNN and NCCL
versions, the GPUs, the CPU, the OS and kernel, the network interfaces and the
``NCCL_*``/``GLOO_*`` variables, this package's version and every optional extra's (read
from the installed distributions' metadata, nothing imported, so it is fast and survives a
broken install: :func:`extra_versions`). What ``python -m torch.utils.collect_env`` and
``accelerate env`` print, for this package: :func:`summary_line` puts it on one line to paste
into an issue; :func:`environment` is the same as plain data for ``doctor --json``. The
verdicts on these facts are :mod:`~gpu_training.diagnostics.doctor.report`'s.

Example:
    >>> print(summary_line(Facts(python="3.11.7", torch="2.13.0+cpu", package="0.1.0",
    ...     system="Linux", kernel="6.8.0", machine="x86_64",
    ...     extras={"deepspeed": "0.19.8", "wandb": None})))
    gpu-training 0.1.0 | torch 2.13.0+cpu | CUDA none | Linux 6.8.0 x86_64 | Python 3.11.7 | deepspeed 0.19.8
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EXTRAS",
    "SHOWN_VARS",
    "SOCKET_VARS",
    "Facts",
    "GpuInfo",
    "collect_facts",
    "cpu_model",
    "environment",
    "extra_versions",
    "os_distro",
    "summary_line",
]

SOCKET_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
"""The variables that pick the network interface of NCCL and gloo."""
SHOWN_VARS = (
    "NCCL_DEBUG",
    "NCCL_IB_DISABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_NET_GDR_LEVEL",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_DISTRIBUTED_DEBUG",
    "MASTER_ADDR",
    "MASTER_PORT",
)
"""The debug and rendezvous variables the report shows when they are set."""


@dataclass(frozen=True)
class GpuInfo:
    """One visible GPU."""

    index: int
    name: str
    memory_gib: float
    capability: str = ""


@dataclass
class Facts:
    """What :func:`collect_facts` found (every field may be filled by hand for tests)."""

    python: str = ""
    torch: str = ""
    cuda_build: str | None = None
    cuda_available: bool = False
    cudnn: int | None = None
    nccl: str | None = None
    nccl_available: bool = False
    gloo_available: bool = True
    gpus: list[GpuInfo] = field(default_factory=list)
    driver: str | None = None
    bf16: bool | None = None
    cpus: int = 1
    memory_gib: float | None = None
    interfaces: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    package: str = ""
    """This package's version (``gpu_training.__version__``)."""
    system: str = ""
    """``platform.system()``: ``Linux``, ``Darwin``..."""
    kernel: str = ""
    """``platform.release()``: the kernel's release."""
    machine: str = ""
    """``platform.machine()``: ``x86_64``, ``aarch64``..."""
    distro: str | None = None
    """The OS's name (``PRETTY_NAME`` of ``/etc/os-release``), when known."""
    cpu_model: str | None = None
    """The CPU's model name, when known."""
    cpu_count: int | None = None
    """Logical CPUs of the machine (``cpus`` is how many this process may use)."""
    extras: dict[str, str | None] = field(default_factory=dict)
    """Each optional extra's package -> its version, None when not installed."""


def collect_facts(env: Mapping[str, str] | None = None) -> Facts:
    """The versions, devices, interfaces and variables of this machine (imports torch).

    Args:
        env: The environment to report (default ``os.environ``).
    """
    import torch
    import torch.distributed as dist

    env = dict(os.environ if env is None else env)
    facts = Facts(python=platform.python_version(), torch=torch.__version__)
    facts.cuda_build = torch.version.cuda
    facts.cuda_available = torch.cuda.is_available()
    facts.nccl_available = dist.is_available() and dist.is_nccl_available()
    facts.gloo_available = dist.is_available() and dist.is_gloo_available()
    if facts.cuda_build:
        try:
            nccl = torch.cuda.nccl.version()
            facts.nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:  # an NCCL-less build
            facts.nccl = None
        facts.cudnn = (
            torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        )
    if facts.cuda_available:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            facts.gpus.append(
                GpuInfo(
                    index, props.name, props.total_memory / 2**30, f"{props.major}.{props.minor}"
                )
            )
        facts.bf16 = bool(torch.cuda.is_bf16_supported())
        facts.driver = _driver_version()
    facts.cpus = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    try:
        import psutil

        facts.memory_gib = psutil.virtual_memory().total / 2**30
    except ImportError:
        facts.memory_gib = None
    try:
        facts.interfaces = [name for _, name in socket.if_nameindex()]
    except OSError:
        facts.interfaces = []
    keep = (*SOCKET_VARS, *SHOWN_VARS, "CUDA_VISIBLE_DEVICES")
    facts.env = {k: env[k] for k in keep if k in env}
    from gpu_training import __version__

    facts.package = __version__
    facts.system, facts.kernel, facts.machine = (
        platform.system(),
        platform.release(),
        platform.machine(),
    )
    facts.distro = os_distro()
    facts.cpu_model = cpu_model()
    facts.cpu_count = os.cpu_count()
    facts.extras = extra_versions()
    return facts


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML: the driver is still there if CUDA works
        return None


# --- the bug report -----------------------------------------------------------------------


# The optional extras' packages: name shown -> distributions that provide it, first found wins.
EXTRAS: dict[str, tuple[str, ...]] = {
    "deepspeed": ("deepspeed",),
    "nvidia-ml-py": ("nvidia-ml-py", "pynvml"),
    "psutil": ("psutil",),
    "matplotlib": ("matplotlib",),
    "tensorboard": ("tensorboard",),
    "transformers": ("transformers",),
    "tokenizers": ("tokenizers",),
    "datasets": ("datasets",),
    "peft": ("peft",),
    "safetensors": ("safetensors",),
    "pyarrow": ("pyarrow",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "accelerate": ("accelerate",),
    "lightning-fabric": ("lightning-fabric", "lightning"),
}


def extra_versions() -> dict[str, str | None]:
    """The version of each package of the optional extras (:data:`EXTRAS`), None if absent.

    Read from the installed distributions' metadata: nothing is imported, so it is fast
    and cannot fail on a broken install.

    Example:
        >>> versions = extra_versions()
        >>> list(versions)[:3]
        ['deepspeed', 'nvidia-ml-py', 'psutil']
    """
    versions: dict[str, str | None] = {}
    for name, dists in EXTRAS.items():
        versions[name] = None
        for dist in dists:
            try:
                versions[name] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), or None when unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or None


def os_distro() -> str | None:
    """The OS's name (``PRETTY_NAME`` of ``/etc/os-release``; the macOS version), or None."""
    if platform.system() == "Darwin":
        return f"macOS {platform.mac_ver()[0]}"
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME")
    except OSError:  # no /etc/os-release
        return None


def summary_line(facts: Facts) -> str:
    """One line to paste into a bug report: package, torch, CUDA and GPUs, OS, Python, extras.

    Args:
        facts: What :func:`collect_facts` found.

    Returns:
        ``gpu-training V | torch V | CUDA V (GPUs, driver) | OS kernel machine | Python V |``
        and the installed extras with their versions.
    """
    cuda = f"CUDA {facts.cuda_build}" if facts.cuda_build else "CUDA none"
    if facts.gpus:
        names = sorted({g.name for g in facts.gpus})
        driver = f", driver {facts.driver}" if facts.driver else ""
        cuda += f" ({len(facts.gpus)}x {' + '.join(names)}{driver})"
    parts = [
        f"gpu-training {facts.package or 'unknown'}",
        f"torch {facts.torch}",
        cuda,
        f"{facts.system} {facts.kernel} {facts.machine}".strip() or "OS unknown",
        f"Python {facts.python}",
    ]
    installed = [f"{k} {v}" for k, v in facts.extras.items() if v is not None]
    return " | ".join([*parts, ", ".join(installed) or "no extras"])


def environment(facts: Facts) -> dict[str, Any]:
    """The bug-report half of the facts, as plain data (``--json``'s ``environment``).

    Returns:
        ``summary`` (:func:`summary_line`), ``package``, ``python``, ``torch``, ``cuda``,
        ``os`` (``system``, ``kernel``, ``machine``, ``distro``), ``cpu`` (``model``,
        ``count``, ``usable``) and ``extras`` (name -> version, null when not installed).
    """
    return {
        "summary": summary_line(facts),
        "package": facts.package,
        "python": facts.python,
        "torch": facts.torch,
        "cuda": facts.cuda_build,
        "os": {
            "system": facts.system,
            "kernel": facts.kernel,
            "machine": facts.machine,
            "distro": facts.distro,
        },
        "cpu": {"model": facts.cpu_model, "count": facts.cpu_count, "usable": facts.cpus},
        "extras": dict(facts.extras),
    }
