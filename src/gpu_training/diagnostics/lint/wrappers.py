"""Which data-parallel wrapper a file puts its model in: any (``DDP``, FSDP, a framework's
``prepare``/``setup``), and whether it is one that all-reduces on every backward (DDP).

``GT013`` (gradient accumulation without ``no_sync()``) is about DDP: an FSDP1 model
reduce-scatters on every micro-batch by design, so a file whose only wrappers are FSDP's is
not reported. Accelerate and Fabric wrap in DDP unless told otherwise: an Accelerate script
whose Accelerator shards with FSDP (``fsdp_plugin=``, or the repository's Accelerate configs:
:func:`~gpu_training.diagnostics.lint.sharded_models.accelerate_sharding`) is not a DDP one.

Example:
    >>> wrapper_kinds({"FSDP"}, None, [])
    (True, False)
    >>> wrapper_kinds({"DistributedDataParallel"}, None, [])
    (True, True)
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.sharded_models import accelerate_sharding

__all__ = ["wrapper_kinds"]

_DDP = frozenset({"DistributedDataParallel", "DDP", "wrap_model"})
_SHARDED = frozenset({"FullyShardedDataParallel", "FSDP", "fully_shard"})


def wrapper_kinds(
    tails: set[str], framework: str | None, calls: list[ast.Call], facts: ModuleFacts | None = None
) -> tuple[bool, bool]:
    """Whether a file wraps a model at all, and whether in DDP.

    Args:
        tails: The last names of the file's calls.
        framework: ``"accelerate"``/``"fabric"`` when the file uses one, else None.
        calls: Every call of the file.
        facts: The file's facts (whether its Accelerator shards).

    Returns:
        ``(wraps, ddp)``.
    """
    prepares = framework is not None and any(
        isinstance(c.func, ast.Attribute) and c.func.attr in ("prepare", "setup") for c in calls
    )
    wraps = bool(tails & (_DDP | _SHARDED)) or prepares
    if prepares and framework == "accelerate" and facts is not None:
        prepares = accelerate_sharding(facts) != "fsdp"  # FSDP: reduce-scatters by design
    return wraps, bool(tails & _DDP) or (prepares and not tails & _SHARDED)
