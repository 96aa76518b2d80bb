"""Which data-parallel wrapper a file puts its model in: any (``DDP``, FSDP, a framework's
``prepare``/``setup``), and whether it is one that all-reduces on every backward (DDP).

``GT013`` (gradient accumulation without ``no_sync()``) is about DDP: an FSDP1 model
reduce-scatters on every micro-batch by design (its ``no_sync()`` trades that for unsharded
gradients in memory), so a file whose only wrappers are FSDP's is not reported. Accelerate
and Fabric wrap in DDP unless told otherwise: an Accelerate script whose Accelerator shards
with FSDP or runs DeepSpeed (``fsdp_plugin=``, ``deepspeed_plugin=DeepSpeedPlugin(
gradient_accumulation_steps=k)``, or the repository's Accelerate configs:
:func:`~gpu_training.diagnostics.lint.sharded_models.accelerate_sharding`) is not a DDP one:
DeepSpeed's engine counts the micro-batches and reduces at its own accumulation boundary,
and ``accelerator.accumulate()`` has no DDP sync to skip there. Likewise a Fabric whose
strategy is DeepSpeed's or FSDP's (``Fabric(strategy="deepspeed_stage_2")``,
``strategy=FSDPStrategy(...)``).

Example:
    >>> wrapper_kinds({"FSDP"}, None, [])
    (True, False)
    >>> wrapper_kinds({"DistributedDataParallel"}, None, [])
    (True, True)
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import keyword_arg
from gpu_training.diagnostics.lint.model import ModuleFacts, dotted
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
        prepares = accelerate_sharding(facts) is None  # FSDP/DeepSpeed: no DDP all-reduce
    elif prepares and framework == "fabric" and facts is not None:
        prepares = not _fabric_shards(facts)
    return wraps, bool(tails & _DDP) or (prepares and not tails & _SHARDED)


_SHARDING_STRATEGIES = frozenset({"DeepSpeedStrategy", "FSDPStrategy", "ModelParallelStrategy"})


def _fabric_shards(facts: ModuleFacts) -> bool:
    """A Fabric built with a DeepSpeed or FSDP strategy (a name or a strategy object)."""
    for call in facts.calls:
        name = call.func.attr if isinstance(call.func, ast.Attribute) else dotted(call.func)
        if name in _SHARDING_STRATEGIES:
            return True
        if name != "Fabric":
            continue
        strategy = keyword_arg(call, "strategy")
        text = strategy.value if isinstance(strategy, ast.Constant) else None
        if isinstance(text, str) and text.lower().startswith(("deepspeed", "fsdp")):
            return True
    return False
