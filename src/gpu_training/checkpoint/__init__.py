"""Checkpoints that are never half-written, and resume that is exact.

One owner per concern, dependencies one way (each module imports only those above it):

- :mod:`~gpu_training.checkpoint.files` — the layout (names, the scan for step directories,
  the manifest built, written and checked) and the durable file-system moves (a checksum while
  writing, fsync, atomic swap, locked temporaries); :mod:`~gpu_training.checkpoint.keys`
  strips wrapper prefixes from state-dict keys; :mod:`~gpu_training.checkpoint.safe_load` is
  the trust boundary (our own ``weights_only`` reader, third-party readers forced to
  ``weights_only`` and an allow-list; the read-back check every writer runs before it
  commits), with :mod:`~gpu_training.checkpoint.dcp_read` and
  :mod:`~gpu_training.checkpoint.zero_read` for DCP's and DeepSpeed's files.
- :mod:`~gpu_training.checkpoint.formats` — :class:`CheckpointFormat`, one object per format
  (plain, sharded, DeepSpeed) and the registry (:func:`checkpoint_format`, :func:`format_of`):
  whatever depends on the format asks it, nothing compares format names.
- :mod:`~gpu_training.checkpoint.offline` — read-only :func:`find_checkpoint`,
  :func:`find_resumable`, :func:`read_manifest`, :func:`verify_checkpoints` for any
  checkpoint directory, and :func:`consolidate` into one ``.safetensors`` / ``.pt`` file for
  an unwrapped model.
- :mod:`~gpu_training.checkpoint.directory` — :class:`CheckpointDirectory`, the one owner of
  a checkpoint root: step directories, resolve, latest, staging, commit, durability, prune,
  stale temporaries. Every writer below is a format adapter on it.
- :mod:`~gpu_training.checkpoint.plain` — rank 0 writes one ``state.pt``, synchronously or
  in the background (:func:`snapshot_state`, :mod:`~gpu_training.checkpoint.snapshot`).
- :mod:`~gpu_training.checkpoint.collective` — the protocol for checkpoints every rank writes
  into (one locked staging directory, rank 0 commits the manifest, an error on any rank reaches
  all through :mod:`~gpu_training.checkpoint.attempt`), used by
  :mod:`~gpu_training.checkpoint.sharded` (FSDP2 through ``torch.distributed.checkpoint``,
  loadable on any world size; :mod:`~gpu_training.checkpoint.dcp_read` reads DCP's pickles
  restrictively) and :mod:`~gpu_training.checkpoint.zero` (DeepSpeed engines);
  :mod:`~gpu_training.checkpoint.reshard` reads a plain checkpoint into FSDP2 shards on any
  world size (the other way, DCP reshards by itself), and
  :mod:`~gpu_training.checkpoint.zero_reshard` anything into a DeepSpeed engine and a
  DeepSpeed checkpoint into anything, per parameter
  (:mod:`~gpu_training.checkpoint.full_state`, :mod:`~gpu_training.checkpoint.zero_source`,
  :mod:`~gpu_training.checkpoint.zero_sink`; the fp16 loss scale between torch's GradScaler
  and DeepSpeed's scaler: :mod:`~gpu_training.checkpoint.loss_scale`). Imported on first use
  (DCP and DeepSpeed cost seconds of import time).
- :mod:`~gpu_training.checkpoint.manager` — :class:`CheckpointManager`, the façade a training
  loop uses: ``save``/``load`` (plain), ``save_sharded``/``load_sharded``,
  ``load_plain_into`` (plain into shards), ``save_deepspeed``/``load_deepspeed``,
  ``load_into_deepspeed``/``load_resharded`` (any layout, per parameter), ``latest``,
  ``find_resumable``...
- :mod:`~gpu_training.checkpoint.export_hf` — a checkpoint of a Hugging Face model as a
  ``save_pretrained`` directory.

Everything public is re-exported here, so ``from gpu_training.checkpoint import
CheckpointManager`` is the import to use.
"""

from __future__ import annotations

from gpu_training.checkpoint.directory import CheckpointDirectory
from gpu_training.checkpoint.files import (
    DEEPSPEED_FORMAT,
    EXTRA_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SHARDED_FORMAT,
    STATE_NAME,
    CheckpointError,
    refused_by_environment,
    run_layout,
)
from gpu_training.checkpoint.formats import CheckpointFormat, checkpoint_format, format_of
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
    "CheckpointDirectory",
    "CheckpointError",
    "CheckpointFormat",
    "CheckpointManager",
    "Resumable",
    "checkpoint_format",
    "consolidate",
    "find_checkpoint",
    "find_resumable",
    "format_of",
    "load_plain",
    "read_manifest",
    "refused_by_environment",
    "run_layout",
    "snapshot_state",
    "state_format",
    "strip_wrapper_prefixes",
    "verify_checkpoints",
]
