"""``gpu-training verify``: prove on your own model that data-parallel training is right.

- :mod:`~gpu_training.diagnostics.verify.report` — :func:`verify_setup` (every check, inside
  a process group), :func:`assert_grads_in_sync` (the one check for a training loop) and the
  :class:`VerifyReport`.
- :mod:`~gpu_training.diagnostics.verify.launch` — :func:`run_verify`: the same on N ranks
  started with ``torchrun``.
- :mod:`~gpu_training.diagnostics.verify.checks` — the checks that train nothing
  (``sampler``, ``data``, ``init``); :mod:`~gpu_training.diagnostics.verify.training_checks`
  — those that train (``grad_sync``, ``params_after_step``, ``accumulation``,
  ``checkpoint``); :mod:`~gpu_training.diagnostics.verify.tp_checks` — those a job with
  ``strategy.tensor_parallel`` > 1 adds (``tp_data``, ``tp_grads``, ``tp_replicated``,
  ``tp_sharded``).
- :mod:`~gpu_training.diagnostics.verify.plan` — the run the checks share
  (:class:`VerifyPlan`, :class:`VerifyModels`), the loss normalized as the Trainer does it
  (:class:`LossKind`, :class:`StepLoss`) and a check's :class:`CheckResult`;
  :mod:`~gpu_training.diagnostics.verify.ranks` — gathering across ranks, comparing with
  rank 0, the DDP wrapper.

Names resolve lazily: ``torchrun`` starts the ranks with ``python -m
gpu_training.diagnostics.verify.launch``, which imports this package first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_training._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "CHECKS": "report",
    "GradientSyncError": "report",
    "VerifyInputError": "report",
    "VerifyReport": "report",
    "assert_grads_in_sync": "report",
    "verify_setup": "report",
    "CheckResult": "plan",
    "LossKind": "plan",
    "StepLoss": "plan",
    "VerifyModels": "plan",
    "VerifyPlan": "plan",
    "default_accumulate": "plan",
    "run_verify": "launch",
    "TP_CHECKS": "tp_checks",
    "TP_TOLERANCE": "tp_checks",
    "check_tensor_parallel": "tp_checks",
}

__all__ = [
    "CHECKS",
    "TP_CHECKS",
    "TP_TOLERANCE",
    "CheckResult",
    "GradientSyncError",
    "LossKind",
    "StepLoss",
    "VerifyInputError",
    "VerifyModels",
    "VerifyPlan",
    "VerifyReport",
    "assert_grads_in_sync",
    "check_tensor_parallel",
    "default_accumulate",
    "run_verify",
    "verify_setup",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from gpu_training.diagnostics.verify.launch import run_verify
    from gpu_training.diagnostics.verify.plan import (
        CheckResult,
        LossKind,
        StepLoss,
        VerifyModels,
        VerifyPlan,
        default_accumulate,
    )
    from gpu_training.diagnostics.verify.report import (
        CHECKS,
        GradientSyncError,
        VerifyInputError,
        VerifyReport,
        assert_grads_in_sync,
        verify_setup,
    )
    from gpu_training.diagnostics.verify.tp_checks import (
        TP_CHECKS,
        TP_TOLERANCE,
        check_tensor_parallel,
    )
