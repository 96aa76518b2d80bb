"""``gpu-training doctor``: the environment as this job will see it, one verdict per line.

- :mod:`~gpu_training.diagnostics.doctor.environment` — the :class:`Facts` of this machine
  (:func:`collect_facts`) and the one-line summary to paste into a bug report.
- :mod:`~gpu_training.diagnostics.doctor.report` — :func:`judge` (the verdicts, a pure
  function of the facts), :func:`run_doctor` and how the report is printed.
- :mod:`~gpu_training.diagnostics.doctor.probe` — :func:`probe_nodes`: several nodes checked
  with a tiny ``torchrun`` job.

Names resolve lazily: nothing here imports torch (:func:`collect_facts` does, when called),
and ``torchrun`` starts the probe's ranks with ``python -m
gpu_training.diagnostics.doctor.probe``, which imports this package first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_training._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Facts": "environment",
    "GpuInfo": "environment",
    "collect_facts": "environment",
    "DoctorCheck": "report",
    "exit_code": "report",
    "format_json": "report",
    "format_report": "report",
    "judge": "report",
    "run_doctor": "report",
    "visible_device_count": "report",
    "probe_nodes": "probe",
}

__all__ = [
    "DoctorCheck",
    "Facts",
    "GpuInfo",
    "collect_facts",
    "exit_code",
    "format_json",
    "format_report",
    "judge",
    "probe_nodes",
    "run_doctor",
    "visible_device_count",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from gpu_training.diagnostics.doctor.environment import Facts, GpuInfo, collect_facts
    from gpu_training.diagnostics.doctor.probe import probe_nodes
    from gpu_training.diagnostics.doctor.report import (
        DoctorCheck,
        exit_code,
        format_json,
        format_report,
        judge,
        run_doctor,
        visible_device_count,
    )
