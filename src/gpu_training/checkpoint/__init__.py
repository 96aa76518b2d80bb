"""Checkpoints that are never half-written, and resume that is exact.

- :mod:`~gpu_training.checkpoint.files` — the layout (names, manifest checks) and the durable
  file-system moves (a checksum while writing, fsync, atomic swap, locked temporaries);
  :mod:`~gpu_training.checkpoint.keys` strips wrapper prefixes from state-dict keys.
- :mod:`~gpu_training.checkpoint.manager` — :class:`CheckpointManager`: plain (full-state)
  checkpoints written by rank 0, atomically, with a manifest, checksums and pruning;
  optionally asynchronous (``save(..., async_save=True)``, :func:`snapshot_state`).
- :mod:`~gpu_training.checkpoint.sharded` — sharded (FSDP2) checkpoints through
  ``torch.distributed.checkpoint``: ``CheckpointManager.save_sharded`` / ``load_sharded``, same
  layout and guarantees, loadable on any world size. Imported on first use (DCP costs ~1 s of
  import time).
- :mod:`~gpu_training.checkpoint.zero` — DeepSpeed engine checkpoints
  (``CheckpointManager.save_deepspeed`` / ``load_deepspeed``) committed the same way.
- :mod:`~gpu_training.checkpoint.collective` — that shared protocol for checkpoints every rank
  writes into (one locked temporary directory, rank 0 commits the manifest, an error on any
  rank reaches all); :mod:`~gpu_training.checkpoint.dcp_read` — the restrictive reading of
  DCP's pickled metadata and values.
- :mod:`~gpu_training.checkpoint.safe_load` — the trust boundary: third-party readers
  (DeepSpeed, DCP) run with every ``torch.load`` forced to ``weights_only`` and an allow-list.
- :mod:`~gpu_training.checkpoint.offline` — read-only :func:`find_checkpoint`,
  :func:`find_resumable`, :func:`read_manifest`, :func:`verify_checkpoints` for any
  checkpoint directory, and
  :func:`consolidate` into one ``.safetensors`` / ``.pt`` file for an unwrapped model.

Everything public is re-exported here, so ``from gpu_training.checkpoint import
CheckpointManager`` is the import to use.
"""

from __future__ import annotations

from gpu_training.checkpoint.files import (
    DEEPSPEED_FORMAT,
    EXTRA_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SHARDED_FORMAT,
    STATE_NAME,
    CheckpointError,
)
from gpu_training.checkpoint.keys import WRAPPER_PREFIXES, strip_wrapper_prefixes
from gpu_training.checkpoint.manager import CheckpointManager
from gpu_training.checkpoint.offline import (
    CONSOLIDATED_SUFFIXES,
    Resumable,
    consolidate,
    find_checkpoint,
    find_resumable,
    load_plain,
    read_manifest,
    state_format,
    verify_checkpoints,
)
from gpu_training.checkpoint.snapshot import snapshot_state

__all__ = [
    "CONSOLIDATED_SUFFIXES",
    "DEEPSPEED_FORMAT",
    "EXTRA_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SHARDED_FORMAT",
    "STATE_NAME",
    "WRAPPER_PREFIXES",
    "CheckpointError",
    "CheckpointManager",
    "Resumable",
    "consolidate",
    "find_checkpoint",
    "find_resumable",
    "load_plain",
    "read_manifest",
    "snapshot_state",
    "state_format",
    "strip_wrapper_prefixes",
    "verify_checkpoints",
]
