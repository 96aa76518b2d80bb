"""The bug-report half of ``gpu-training doctor``: versions and machine in one line.

What ``python -m torch.utils.collect_env`` and ``accelerate env`` print, for this package:
its version and every optional extra's (read from the installed distributions' metadata,
nothing imported, so it is fast and survives a broken install), the OS and kernel, the CPU.
:func:`summary_line` puts it on one line to paste into an issue; :func:`environment` is the
same as plain data for ``doctor --json``.

Example:
    >>> from gpu_training.diagnostics.doctor import Facts
    >>> print(summary_line(Facts(python="3.11.7", torch="2.13.0+cpu", package="0.1.0",
    ...     system="Linux", kernel="6.8.0", machine="x86_64",
    ...     extras={"deepspeed": "0.19.8", "wandb": None})))
    gpu-training 0.1.0 | torch 2.13.0+cpu | CUDA none | Linux 6.8.0 x86_64 | Python 3.11.7 | deepspeed 0.19.8
"""

from __future__ import annotations

import importlib.metadata
import platform
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_training.diagnostics.doctor import Facts

__all__ = ["EXTRAS", "cpu_model", "environment", "extra_versions", "os_distro", "summary_line"]

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
        facts: What :func:`~gpu_training.diagnostics.doctor.collect_facts` found.

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
