"""The calls whose result ``lint`` knows the kind of, by the callee's last name part
(``DistributedDataParallel(...)`` is a ``"ddp"`` wrapper, ``DataLoader(...)`` a ``"loader"``),
and the methods through which a kind passes (``model.to(device)`` is still the model).

Read by :meth:`~gpu_training.diagnostics.lint.model.ModuleFacts.kinds`.

Example:
    >>> CALL_KINDS["DistributedDataParallel"], "to" in PASSTHROUGH_METHODS
    ('ddp', True)
"""

from __future__ import annotations

__all__ = ["CALL_KINDS", "PASSTHROUGH_METHODS"]

# Calls whose result is (or wraps) a known kind of object, by the callee's last name part.
CALL_KINDS: dict[str, str] = {
    "DistributedDataParallel": "ddp",
    "DDP": "ddp",
    "DataParallel": "dp",
    "FullyShardedDataParallel": "fsdp",
    "FSDP": "fsdp",
    "fully_shard": "fsdp",
    "DistributedSampler": "dist_sampler",
    "make_distributed_sampler": "dist_sampler",
    "GlobalBatchSampler": "dist_sampler",
    "RandomSampler": "local_sampler",
    "SequentialSampler": "local_sampler",
    "WeightedRandomSampler": "local_sampler",
    "SubsetRandomSampler": "local_sampler",
    "DataLoader": "loader",
    "Accelerator": "accelerator",
    "Fabric": "fabric",
    "GradScaler": "scaler",
    "ShardedGradScaler": "scaler",
    "CheckpointManager": "ckpt_manager",
    "getLogger": "logger",
    "get_logger": "logger",
    "SummaryWriter": "writer",
    "MixedPrecisionStepper": "amp_stepper",
    "MixedPrecisionTrainer": "amp_stepper",
    "linear_warmup_cosine_lr": "scheduler",
    "open": "file",
    "mkdtemp": "tempfile",
    "mkstemp": "tempfile",
    "NamedTemporaryFile": "tempfile",
    "TemporaryDirectory": "tempfile",
    "gettempdir": "tempfile",
    "BytesIO": "buffer",
}
# Methods that return their receiver (or a same-kind object): the kind passes through.
PASSTHROUGH_METHODS = frozenset(
    {"to", "cuda", "cpu", "float", "half", "bfloat16", "double", "train", "eval", "requires_grad_"}
)
