"""Which calls are collectives: the ``torch.distributed`` ones and the toolkit's helpers.

A collective must be reached by every rank or the job hangs (``GT009``); a function that runs
one makes its callers collectives too. This module knows the calls themselves (the walk of
:mod:`~gpu_training.diagnostics.lint.ranks` and the project summaries of
:mod:`~gpu_training.diagnostics.lint.project` follow the functions that run them).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("import torch.distributed as dist\\ndist.barrier()\\n")
    >>> facts = ModuleFacts(tree)
    >>> direct_collective(tree.body[1].value, facts.module_scope, facts)
    'barrier'
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import keyword_arg, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name

__all__ = ["COLLECTIVES", "DIST_SETUP_CALLS", "direct_collective"]

DIST_SETUP_CALLS = frozenset(
    {
        "init_process_group",
        "init_distributed",
        "DistributedDataParallel",
        "DDP",
        "FullyShardedDataParallel",
        "FSDP",
        "fully_shard",
        "DistributedSampler",
        "make_distributed_sampler",
        "GlobalBatchSampler",
        "wrap_model",
    }
)
"""Callee names (last part) that set up distributed training: a process group, a wrapper, a
distributed sampler."""

COLLECTIVES = frozenset(
    {
        "barrier",
        "monitored_barrier",
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "all_to_all",
        "all_to_all_single",
        "new_group",
        "get_model_state_dict",
        "get_optimizer_state_dict",
        "get_state_dict",
    }
)
"""``torch.distributed`` functions every rank must call (by last name). Not
``init_process_group``: a subset of the processes may form a group of its own
(``if rank <= 1: init_process_group(world_size=2)``, the RPC examples)."""
_TOOLKIT_COLLECTIVES = frozenset(
    {
        "reduce_scalar_dict",
        "train_one_epoch",
        "capture_training_state",
        "gather_rng_states",
        "init_distributed",
        "cleanup_distributed",
    }
)
_CKPT_COLLECTIVE_METHODS = frozenset({"save", "wait", "close", "save_sharded", "load_sharded"})


def direct_collective(call: ast.Call, scope: Scope, facts: ModuleFacts) -> str | None:
    """The collective a call itself runs (not through this file's functions), if any.

    Args:
        call: The call.
        scope: Where it appears (for the kinds of its receiver).
        facts: The file's facts.

    Returns:
        Its name as reported (``all_reduce``, ``CheckpointManager.save``…), or None.
    """
    name = call_name(call, facts.imports)
    last = tail(name)
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    head = name.split(".")[0]
    if last in COLLECTIVES and (
        name.startswith("torch.distributed") or head in ("dist", "distributed")
    ):
        return last
    if method in ("barrier", "monitored_barrier", "wait_for_everyone"):
        return method
    toolkit = last in _TOOLKIT_COLLECTIVES or (
        last == "find_max_batch_size" and keyword_arg(call, "ctx") is not None
    )
    if toolkit and _is_toolkit(name, facts):
        return last
    if name.startswith("torch.distributed.checkpoint") and last in ("save", "load"):
        return f"dcp.{last}"
    if isinstance(call.func, ast.Attribute):
        kinds = facts.kinds(call.func.value, scope)
        if method in _CKPT_COLLECTIVE_METHODS and "ckpt_manager" in kinds:
            return f"CheckpointManager.{method}"
        if method == "state_dict" and "fsdp" in kinds:
            return "FSDP state_dict (all-gather)"
    return None


def _is_toolkit(name: str, facts: ModuleFacts) -> bool:
    """``gpu_training``'s helper, not a function of the script's own by the same name (DeiT
    and MAE have their own ``train_one_epoch``): imported from it, or used bare in a file that
    imports from it (a guide's snippet)."""
    if name.startswith("gpu_training."):
        return True
    head = name.split(".")[0]
    if head in facts.imports.names or head in facts.functions:
        return False
    return any(target.startswith("gpu_training") for target in facts.imports.names.values())
