"""Checkpoints that are never half-written, and resume that is exact.

- :mod:`~gpu_training.checkpoint.manager` — :class:`CheckpointManager`: plain (full-state)
  checkpoints written by rank 0, atomically, with a manifest, checksums and pruning;
  optionally asynchronous (``save(..., async_save=True)``, :func:`snapshot_state`).
- :mod:`~gpu_training.checkpoint.sharded` — sharded (FSDP2) checkpoints through
  ``torch.distributed.checkpoint`` (``CheckpointManager.save_sharded`` / ``load_sharded``, any
  world size), :func:`consolidate` into one ``.safetensors`` / ``.pt`` file, and read-only
  :func:`find_checkpoint` / :func:`read_manifest` / :func:`verify_checkpoints`. Imported on
  first use (DCP costs ~1 s of import time). Sharded checkpoints are trusted input only.

Everything public is re-exported here, so ``from gpu_training.checkpoint import
CheckpointManager`` is the import to use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_training.checkpoint.manager import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    STATE_NAME,
    WRAPPER_PREFIXES,
    CheckpointError,
    CheckpointManager,
    snapshot_state,
    strip_wrapper_prefixes,
)

if TYPE_CHECKING:
    from gpu_training.checkpoint.sharded import (
        CONSOLIDATED_SUFFIXES,
        EXTRA_NAME,
        SHARDED_FORMAT,
        consolidate,
        find_checkpoint,
        read_manifest,
        state_format,
        verify_checkpoints,
    )

_SHARDED = frozenset(
    {
        "CONSOLIDATED_SUFFIXES",
        "EXTRA_NAME",
        "SHARDED_FORMAT",
        "consolidate",
        "find_checkpoint",
        "read_manifest",
        "state_format",
        "verify_checkpoints",
    }
)

__all__ = [
    "CONSOLIDATED_SUFFIXES",
    "EXTRA_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SHARDED_FORMAT",
    "STATE_NAME",
    "WRAPPER_PREFIXES",
    "CheckpointError",
    "CheckpointManager",
    "consolidate",
    "find_checkpoint",
    "read_manifest",
    "snapshot_state",
    "state_format",
    "strip_wrapper_prefixes",
    "verify_checkpoints",
]


def __getattr__(name: str) -> Any:
    # sharded.py imports torch.distributed.checkpoint: only pay for it when it is used
    if name in _SHARDED:
        from gpu_training.checkpoint import sharded

        return getattr(sharded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
