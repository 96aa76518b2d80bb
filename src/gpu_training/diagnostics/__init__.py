"""Catch the mistakes before they cost a day: ``lint``, ``verify``, ``doctor``; hang reports.

Three tools, one subpackage each:

- :mod:`~gpu_training.diagnostics.lint` — static checks of a training script, one rule per
  pitfall of the guides (``gpu-training lint``): the entry points and the report in
  :mod:`~gpu_training.diagnostics.lint.report`, rule texts in
  :mod:`~gpu_training.diagnostics.lint.rules`, what names stand for in
  :mod:`~gpu_training.diagnostics.lint.model`, the walk in
  :mod:`~gpu_training.diagnostics.lint.checks` with the rank analysis
  (:mod:`~gpu_training.diagnostics.lint.ranks`) and the training-loop analysis
  (:mod:`~gpu_training.diagnostics.lint.training_loop`). No torch.
- :mod:`~gpu_training.diagnostics.verify` — run a user's model and data on N ranks and prove
  sharding, gradient averaging, accumulation and checkpoint round-trips right
  (``gpu-training verify``): :func:`verify_setup` and :func:`assert_grads_in_sync` (for a
  training loop) in :mod:`~gpu_training.diagnostics.verify.report`, the checks in
  :mod:`~gpu_training.diagnostics.verify.checks` and
  :mod:`~gpu_training.diagnostics.verify.training_checks`, :func:`run_verify` (the same on N
  ranks started with ``torchrun``) in :mod:`~gpu_training.diagnostics.verify.launch`.
- :mod:`~gpu_training.diagnostics.doctor` — the environment as a job will see it
  (``gpu-training doctor``): the facts in :mod:`~gpu_training.diagnostics.doctor.environment`,
  the verdicts in :mod:`~gpu_training.diagnostics.doctor.report`, several nodes checked with a
  tiny ``torchrun`` job in :mod:`~gpu_training.diagnostics.doctor.probe`.

Hangs that name the rank are runtime, below the Trainer, and re-exported here:
:mod:`~gpu_training.watchdog` (:func:`entry_point`, :func:`enable_debug_mode`,
:func:`monitored_barrier`, :class:`StallWatchdog`); what a stalled rank reports, and how the
ranks' reports meet, in :mod:`~gpu_training.stall_report`.

Names resolve lazily (``lint`` and ``doctor`` must not pay for ``import torch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_training._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Finding": "lint",
    "LintError": "lint",
    "lint_paths": "lint",
    "lint_source": "lint",
    "RULES": "lint",
    "Rule": "lint",
    "explain": "lint",
    "VerifyReport": "verify",
    "CheckResult": "verify",
    "GradientSyncError": "verify",
    "assert_grads_in_sync": "verify",
    "verify_setup": "verify",
    "run_verify": "verify",
    "DoctorCheck": "doctor",
    "run_doctor": "doctor",
    # gpu_training.watchdog: runtime, beside the package (a leading dot)
    "EXIT_STALLED": ".watchdog",
    "StallWatchdog": ".watchdog",
    "StallReport": ".watchdog",
    "enable_debug_mode": ".watchdog",
    "debug_mode_enabled": ".watchdog",
    "entry_point": ".watchdog",
    "monitored_barrier": ".watchdog",
}

__all__ = [
    "EXIT_STALLED",
    "RULES",
    "CheckResult",
    "DoctorCheck",
    "Finding",
    "GradientSyncError",
    "LintError",
    "Rule",
    "StallReport",
    "StallWatchdog",
    "VerifyReport",
    "assert_grads_in_sync",
    "debug_mode_enabled",
    "enable_debug_mode",
    "entry_point",
    "explain",
    "lint_paths",
    "lint_source",
    "monitored_barrier",
    "run_doctor",
    "run_verify",
    "verify_setup",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from gpu_training.diagnostics.doctor import DoctorCheck, run_doctor
    from gpu_training.diagnostics.lint import (
        RULES,
        Finding,
        LintError,
        Rule,
        explain,
        lint_paths,
        lint_source,
    )
    from gpu_training.diagnostics.verify import (
        CheckResult,
        GradientSyncError,
        VerifyReport,
        assert_grads_in_sync,
        run_verify,
        verify_setup,
    )
    from gpu_training.watchdog import (
        EXIT_STALLED,
        StallReport,
        StallWatchdog,
        debug_mode_enabled,
        enable_debug_mode,
        entry_point,
        monitored_barrier,
    )
