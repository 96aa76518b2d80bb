"""Know before you run: what a training step holds in GPU memory, measured and tracked.

- :mod:`~gpu_training.memory.budget` (no torch): :func:`format_bytes`, the model-state byte
  model (:func:`model_state_bytes`, :func:`per_gpu_bytes`), :class:`TransformerShape` and the
  :class:`MemoryEstimate` breakdown.
- :mod:`~gpu_training.memory.measure`: saved-for-backward bytes and a live-tensor tracker,
  on real or fake tensors.
- :mod:`~gpu_training.memory.estimate`: :func:`estimate_memory` and :func:`profile_memory`:
  parameters, gradients, optimizer state, activations (measured), temporary buffers and
  overhead per GPU, for any strategy and world size.
- :mod:`~gpu_training.memory.profile`: :class:`MemoryProfile`, the measured profile, and its
  layout per strategy and world size.
- :mod:`~gpu_training.memory.reference`: :func:`reference_transformer`, what a shape is
  measured on.
- :mod:`~gpu_training.memory.tracking`: :func:`memory_tracking`, :func:`clear_cuda_cache`,
  :func:`explain_oom` (the guide's OOM flowchart).

Names resolve lazily, so ``from gpu_training.memory import format_bytes`` does not import torch.

Example:
    >>> from gpu_training.memory import TransformerShape, format_bytes, model_state_bytes
    >>> shape = TransformerShape(num_layers=32, hidden_size=4096, seq_len=4096,
    ...                          vocab_size=32000, arch="llama")
    >>> format_bytes(model_state_bytes(shape.num_params(), "bf16").total)
    '100.4 GiB'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_training._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    # budget (no torch)
    "CUBLAS_HANDLES_PER_STEP": "budget",
    "DEFAULT_OVERHEAD_BYTES": "budget",
    "LAYOUTS": "budget",
    "OPTIMIZER_STATE_BYTES": "budget",
    "MemoryBudgetError": "budget",
    "MemoryEstimate": "budget",
    "ModelStateBytes": "budget",
    "TransformerShape": "budget",
    "cublas_workspace_bytes": "budget",
    "format_bytes": "budget",
    "model_state_bytes": "budget",
    "parse_layout": "budget",
    "per_gpu_bytes": "budget",
    # measure
    "LiveTensorTracker": "measure",
    "detect_blocks": "measure",
    "measure_activation_bytes": "measure",
    "profile_step": "measure",
    "repeated_blocks": "measure",
    # estimate
    "estimate_memory": "estimate",
    "profile_memory": "estimate",
    # profile
    "MemoryProfile": "profile",
    # reference
    "reference_transformer": "reference",
    # tracking
    "OOMDiagnosis": "tracking",
    "clear_cuda_cache": "tracking",
    "explain_oom": "tracking",
    "memory_tracking": "tracking",
}

__all__ = [
    "CUBLAS_HANDLES_PER_STEP",
    "DEFAULT_OVERHEAD_BYTES",
    "LAYOUTS",
    "OPTIMIZER_STATE_BYTES",
    "LiveTensorTracker",
    "MemoryBudgetError",
    "MemoryEstimate",
    "MemoryProfile",
    "ModelStateBytes",
    "OOMDiagnosis",
    "TransformerShape",
    "clear_cuda_cache",
    "cublas_workspace_bytes",
    "detect_blocks",
    "estimate_memory",
    "explain_oom",
    "format_bytes",
    "measure_activation_bytes",
    "memory_tracking",
    "model_state_bytes",
    "parse_layout",
    "per_gpu_bytes",
    "profile_memory",
    "profile_step",
    "reference_transformer",
    "repeated_blocks",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from gpu_training.memory.budget import (
        CUBLAS_HANDLES_PER_STEP,
        DEFAULT_OVERHEAD_BYTES,
        LAYOUTS,
        OPTIMIZER_STATE_BYTES,
        MemoryBudgetError,
        MemoryEstimate,
        ModelStateBytes,
        TransformerShape,
        cublas_workspace_bytes,
        format_bytes,
        model_state_bytes,
        parse_layout,
        per_gpu_bytes,
    )
    from gpu_training.memory.estimate import estimate_memory, profile_memory
    from gpu_training.memory.measure import (
        LiveTensorTracker,
        detect_blocks,
        measure_activation_bytes,
        profile_step,
        repeated_blocks,
    )
    from gpu_training.memory.profile import MemoryProfile
    from gpu_training.memory.reference import reference_transformer
    from gpu_training.memory.tracking import (
        OOMDiagnosis,
        clear_cuda_cache,
        explain_oom,
        memory_tracking,
    )
