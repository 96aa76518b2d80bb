"""Spreading a model over GPUs: choose DDP, FSDP2 or DeepSpeed ZeRO, and wrap it.

- :mod:`~gpu_training.strategy.spec` — :class:`StrategyConfig` (a strategy is data) and
  :class:`StrategyError`; no torch.
- :mod:`~gpu_training.strategy.choose` — :func:`choose_strategy`, the guide's decision tree
  on a memory estimate; no torch.
- :mod:`~gpu_training.strategy.wrap` — :func:`wrap_model` for none/ddp/fsdp, block
  detection, activation checkpointing, :class:`StepFns`.
- :mod:`~gpu_training.strategy.deepspeed` — :func:`build_deepspeed_config` (fills every
  ``"auto"``) and :func:`deepspeed_initialize`.
- :mod:`~gpu_training.strategy.prepared` — :func:`prepare`: model, optimizer and step
  functions in one call, for every strategy; :class:`Prepared` saves and loads itself in the
  strategy's checkpoint format.
- :mod:`~gpu_training.strategy.tensor_parallel` — the 2-D (FSDP × TP) mesh, a model's
  tensor-parallel plan, and the data-parallel view of a rank (:func:`data_parallel_context`).
- :mod:`~gpu_training.strategy.job_check` — :func:`check_job`: a job's strategy options
  against its task's model, before any process starts.

Names resolve lazily, so ``from gpu_training.strategy import choose_strategy`` does not import
torch::

    >>> from gpu_training.strategy import choose_strategy
    >>> choose_strategy(1_500_000_000, gpu_memory_bytes=80 * 2**30, num_gpus=8).strategy
    'ddp'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_training._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    # spec (no torch)
    "OFFLOAD_MODES": "spec",
    "SHARDINGS": "spec",
    "STRATEGIES": "spec",
    "StrategyConfig": "spec",
    "StrategyError": "spec",
    "parse_strategy": "spec",
    # choose (no torch)
    "CANDIDATES": "choose",
    "ModelStateBytes": "choose",
    "StrategyChoice": "choose",
    "choose_strategy": "choose",
    "format_bytes": "choose",
    "model_state_bytes": "choose",
    "per_gpu_bytes": "choose",
    # wrap
    "StepFns": "wrap",
    "apply_activation_checkpointing": "wrap",
    "detect_blocks": "wrap",
    "find_blocks": "wrap",
    "step_fns": "wrap",
    "wrap_model": "wrap",
    # deepspeed
    "DEFAULT_DEEPSPEED_CONFIG": "deepspeed",
    "build_deepspeed_config": "deepspeed",
    "deepspeed_initialize": "deepspeed",
    "deepspeed_step_fns": "deepspeed",
    "find_auto_values": "deepspeed",
    # tensor parallel
    "TP_STYLES": "spec",
    "apply_plan": "tensor_parallel",
    "data_parallel_context": "tensor_parallel",
    "resolve_plan": "tensor_parallel",
    "two_d_mesh": "tensor_parallel",
    # job check
    "check_job": "job_check",
    # prepare
    "Prepared": "prepared",
    "default_optimizer": "prepared",
    "prepare": "prepared",
}

__all__ = [
    "CANDIDATES",
    "DEFAULT_DEEPSPEED_CONFIG",
    "OFFLOAD_MODES",
    "SHARDINGS",
    "STRATEGIES",
    "TP_STYLES",
    "ModelStateBytes",
    "Prepared",
    "StepFns",
    "StrategyChoice",
    "StrategyConfig",
    "StrategyError",
    "apply_activation_checkpointing",
    "apply_plan",
    "build_deepspeed_config",
    "check_job",
    "choose_strategy",
    "data_parallel_context",
    "deepspeed_initialize",
    "deepspeed_step_fns",
    "default_optimizer",
    "detect_blocks",
    "find_auto_values",
    "find_blocks",
    "format_bytes",
    "model_state_bytes",
    "parse_strategy",
    "per_gpu_bytes",
    "prepare",
    "resolve_plan",
    "step_fns",
    "two_d_mesh",
    "wrap_model",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from gpu_training.strategy.choose import (
        CANDIDATES,
        ModelStateBytes,
        StrategyChoice,
        choose_strategy,
        format_bytes,
        model_state_bytes,
        per_gpu_bytes,
    )
    from gpu_training.strategy.deepspeed import (
        DEFAULT_DEEPSPEED_CONFIG,
        build_deepspeed_config,
        deepspeed_initialize,
        deepspeed_step_fns,
        find_auto_values,
    )
    from gpu_training.strategy.job_check import check_job
    from gpu_training.strategy.prepared import Prepared, default_optimizer, prepare
    from gpu_training.strategy.spec import (
        OFFLOAD_MODES,
        SHARDINGS,
        STRATEGIES,
        TP_STYLES,
        StrategyConfig,
        StrategyError,
        parse_strategy,
    )
    from gpu_training.strategy.tensor_parallel import (
        apply_plan,
        data_parallel_context,
        resolve_plan,
        two_d_mesh,
    )
    from gpu_training.strategy.wrap import (
        StepFns,
        apply_activation_checkpointing,
        detect_blocks,
        find_blocks,
        step_fns,
        wrap_model,
    )
