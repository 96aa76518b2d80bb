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
from collections.abc import Callable

from gpu_training.diagnostics.lint.calls import keyword_arg, tail
from gpu_training.diagnostics.lint.ddp_buffers import ddp_forward_buffers
from gpu_training.diagnostics.lint.hf_sharded_saves import trainer_shards
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.sharded_models import (
    accelerate_sharding,
    accelerate_unsharded,
    names_checkpoints,
    sharded_model,
    shards_anything,
)

__all__ = ["COLLECTIVES", "DIST_SETUP_CALLS", "UNDECIDED", "direct_collective", "switched_off"]

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
_SHARDED_STATE = frozenset({"state_dict", "save_pretrained"})


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
    if last == "summon_full_params":  # FSDP's context that all-gathers every parameter
        return "FSDP summon_full_params (all-gather)"
    if (
        last == "DistributedDataParallel"
        and name.startswith("torch.nn.parallel")
        and keyword_arg(call, "process_group") is None
        and keyword_arg(call, "device_mesh") is None
    ):  # its constructor checks the parameters' shapes across ranks and broadcasts rank 0's
        return "DistributedDataParallel() (broadcasts rank 0's parameters)"
    if method in _CKPT_COLLECTIVE_METHODS:
        assert isinstance(call.func, ast.Attribute)
        if "ckpt_manager" in facts.kinds(call.func.value, scope):
            return f"CheckpointManager.{method}"
    if method in _SHARDED_STATE and keyword_arg(call, "state_dict") is None:
        assert isinstance(call.func, ast.Attribute)
        # the state dict of a sharded model (an all-gather, or the metadata exchange of a
        # sharded one), itself or through save_pretrained(), which takes it
        if not facts.local_functions(call) and sharded_model(call.func.value, scope, facts):
            return f"FSDP {method} (all-gathers the shards)"
    library = _library_collective(call, scope, facts)
    if library is not None:
        return library
    return None


# Methods of a framework's object that run a collective under the hood: every process must
# call them. Accelerate's save_state (a barrier, and DeepSpeed/FSDP shards), its gathers;
# Fabric's save and reductions; a DeepSpeed engine's and a Lightning Trainer's checkpoints.
_ACCELERATE_COLLECTIVES = frozenset(
    {"save_state", "load_state", "gather", "gather_for_metrics", "reduce", "pad_across_processes"}
)
_FABRIC_COLLECTIVES = frozenset({"save", "load", "all_reduce", "all_gather", "broadcast"})
_ENGINE_COLLECTIVES = frozenset({"save_checkpoint", "load_checkpoint"})
_SHARDED_FORWARD = frozenset({"generate", "forward"})
_LIBRARY_METHODS = (
    _ACCELERATE_COLLECTIVES
    | _FABRIC_COLLECTIVES
    | _ENGINE_COLLECTIVES
    | _SHARDED_FORWARD
    | {"save_model"}  # a Hugging Face Trainer's, when it shards (hf_sharded_saves)
)


def _library_collective(call: ast.Call, scope: Scope, facts: ModuleFacts) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        method = func.attr
        receiver = func.value
        if method not in _LIBRARY_METHODS:
            # `self.model(batch)`: the forward of a sharded model held in an attribute
            if shards_anything(facts) and _sharded(func, scope, facts):
                return "FSDP forward (all-gathers the shards)"
            return _ddp_forward(
                call, scope, facts
            )  # the only methods below that can be one; resolving the rest is costly
        if facts.local_functions(call) or (
            facts.resolver is not None and any(f is not facts for f, _ in facts.callees(call))
        ):
            return None  # the project's own method: its body says what it does
        kinds = facts.kinds(receiver, scope)
        label = (dotted(receiver) or "").rsplit(".", 1)[-1].lower()
        if method in _ACCELERATE_COLLECTIVES and (
            "accelerator" in kinds or ("accelerator" in label and _imports(facts, "accelerate"))
        ):
            if method == "load_state" and accelerate_sharding(facts) is None:
                return None  # under DDP each process reads the files alone: no collective
            if (
                method == "save_state"
                and accelerate_unsharded(facts)
                and not names_checkpoints(facts)
            ):
                return None  # known DDP: each process saves alone, nothing synchronises
            if method in ("save_state", "load_state"):
                return f"Accelerator.{method} (sharded under DeepSpeed/FSDP, a barrier with automatic naming)"
            return f"Accelerator.{method}"
        if method in _FABRIC_COLLECTIVES and (
            "fabric" in kinds or (label == "fabric" and _imports(facts, "lightning"))
        ):
            return f"Fabric.{method}"
        if method in _ENGINE_COLLECTIVES:
            if _imports(facts, "deepspeed"):
                return f"DeepSpeed engine {method}"
            if _imports(facts, "lightning", "pytorch_lightning") and "trainer" in label:
                return f"Trainer.{method}"
        if method in _SHARDED_FORWARD and _sharded(receiver, scope, facts):
            return f"FSDP {method} (all-gathers the shards)"
        if method == "save_model" and (shards := trainer_shards(receiver, scope, facts)):
            return f"Trainer.save_model (gathers the weights under {shards})"
        return _ddp_forward(call, scope, facts) if method == "forward" else None
    if isinstance(func, (ast.Name, ast.Attribute)) and _sharded(func, scope, facts):
        return "FSDP forward (all-gathers the shards)"
    return _ddp_forward(call, scope, facts)


def _ddp_forward(call: ast.Call, scope: Scope, facts: ModuleFacts) -> str | None:
    """A DDP model's forward, when its module has buffers: DDP broadcasts them from rank 0
    (:mod:`~gpu_training.diagnostics.lint.ddp_buffers`)."""
    found = ddp_forward_buffers(call, scope, facts)
    return None if found is None else f"DDP forward (broadcasts the module's buffers: {found})"


def _imports(facts: ModuleFacts, *packages: str) -> bool:
    return any(
        target.split(".")[0] in packages or target.split(".")[0].replace("_", "") in packages
        for target in facts.imports.names.values()
    )


def _sharded(expr: ast.expr, scope: Scope, facts: ModuleFacts) -> bool:
    """A model sharded by FSDP (:func:`~gpu_training.diagnostics.lint.sharded_models.sharded_model`):
    its forward all-gathers; not inside ``with FSDP.summon_full_params(model):``, where its
    parameters are whole already (the gather is the context's, reported at the ``with``)."""
    return sharded_model(expr, scope, facts) and not _summoned(expr, scope, facts)


def _summoned(expr: ast.expr, scope: Scope, facts: ModuleFacts) -> bool:
    key = dotted(expr)
    line = getattr(expr, "lineno", 0)
    for node in facts.scope_nodes.get(scope.node, []):
        if not isinstance(node, ast.With) or not node.lineno <= line <= (node.end_lineno or 0):
            continue
        for item in node.items:
            call = item.context_expr
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "summon_full_params"
            ):
                continue
            summoned = {dotted(call.func.value), *(dotted(a) for a in call.args[:1])}
            if key in summoned and any(expr is n for s in node.body for n in ast.walk(s)):
                return True
    return False


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


_UNKNOWN = object()
UNDECIDED = _UNKNOWN
"""What :func:`literal` returns for an expression the literals do not decide."""
_Func = ast.FunctionDef | ast.AsyncFunctionDef
_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}


def bound_constants(func: _Func, call: ast.Call) -> dict[str, object]:
    """The parameters of ``func`` a call binds to literals (``zero_first(-1)`` → ``{"local_rank":
    -1}``), defaults included; a parameter passed anything else is left out."""
    args = func.args
    positional = [a.arg for a in [*args.posonlyargs, *args.args]]
    if positional and positional[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
        positional = positional[1:]
    env: dict[str, object] = {}
    defaults = dict(
        zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=False)
    )
    defaults |= {
        a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    }
    for name, default in defaults.items():
        value = literal(default, {})
        if value is not _UNKNOWN:
            env[name] = value
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return {}  # `f(*args, **kwargs)`: which parameter gets what is unknown
    passed = dict(zip(positional, call.args, strict=False))  # extra ones go to *args
    passed |= {k.arg: k.value for k in call.keywords if k.arg is not None}
    for name, expr in passed.items():
        value = literal(expr, {})
        if value is _UNKNOWN:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def literal(expr: ast.expr, env: dict[str, object]) -> object:
    """The value of an expression over literals and the names in ``env`` (``local_rank not in
    [-1, 0]`` with ``local_rank=-1`` → False), or ``_UNKNOWN``."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, ast.Name):
        return env.get(expr.id, _UNKNOWN)
    if isinstance(expr, ast.UnaryOp):
        inner = literal(expr.operand, env)
        if inner is _UNKNOWN:
            return _UNKNOWN
        if isinstance(expr.op, ast.Not):
            return not inner
        if isinstance(expr.op, ast.USub) and isinstance(inner, (int, float)):
            return -inner
        return _UNKNOWN
    if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
        values = [literal(e, env) for e in expr.elts]
        return _UNKNOWN if any(v is _UNKNOWN for v in values) else tuple(values)
    if isinstance(expr, ast.BoolOp):
        unknown = False
        for value in (literal(v, env) for v in expr.values):
            if value is _UNKNOWN:
                unknown = True
            elif (not value) if isinstance(expr.op, ast.And) else bool(value):
                return value  # `False and ...`, `True or ...`: decided
        return _UNKNOWN if unknown else (isinstance(expr.op, ast.And))
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
        left, right = literal(expr.left, env), literal(expr.comparators[0], env)
        compare = _COMPARE.get(type(expr.ops[0]))
        if left is _UNKNOWN or right is _UNKNOWN or compare is None:
            return _UNKNOWN
        try:
            return bool(compare(left, right))
        except TypeError:
            return _UNKNOWN
    return _UNKNOWN


def switched_off(func: _Func, call: ast.Call, runs_collective: Callable[[ast.Call], bool]) -> bool:
    """Whether the arguments of ``call`` turn off every collective of ``func``: each sits under
    a test they decide against it (``torch_distributed_zero_first(-1)``, whose barriers run
    when ``local_rank not in [-1, 0]`` and when ``local_rank == 0``; ``run(evaluate=True)``
    past ``if evaluate: return``).

    Args:
        func: The callee.
        call: The call site.
        runs_collective: Whether a call inside ``func`` runs a collective.
    """
    env = bound_constants(func, call)
    if not env:
        return False
    state = {"sites": 0, "on": 0}

    def walk(stmts: list[ast.stmt], live: bool) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(stmt, ast.If):
                _count(stmt.test, live)
                value = literal(stmt.test, env)
                walk(stmt.body, live and (value is _UNKNOWN or bool(value)))
                walk(stmt.orelse, live and (value is _UNKNOWN or not value))
                taken = stmt.body if value is not _UNKNOWN and value else stmt.orelse
                if (
                    value is not _UNKNOWN
                    and taken
                    and isinstance(taken[-1], (ast.Return, ast.Raise))
                ):
                    live = False  # `if evaluate: return` - nothing below runs
                continue
            blocks = [getattr(stmt, f) for f in ("body", "orelse", "finalbody") if hasattr(stmt, f)]
            blocks += [h.body for h in getattr(stmt, "handlers", [])]
            heads = [
                getattr(stmt, f)
                for f in ("test", "iter", "value", "items", "targets", "exc")
                if hasattr(stmt, f)
            ]
            for head in heads:
                for part in head if isinstance(head, list) else [head]:
                    if isinstance(part, ast.AST):
                        _count(part, live)
            for block in blocks:
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    walk(block, live)

    def _count(node: ast.AST, live: bool) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and runs_collective(sub):
                state["sites"] += 1
                state["on"] += live

    walk(func.body, True)
    return state["sites"] > 0 and state["on"] == 0
