"""Which rank a guard reads, and the names that say "rank 0" where no body can be read.

* :func:`guard_locality` — ``"local"`` (the rank within the node: ``local_rank == 0`` holds
  once per node, ``dist.get_rank(group=local_group)``), ``"global"``, or None;
* :data:`FLAG_NAMES` — the flags of frameworks and installed packages (``is_main_process``,
  ``is_global_zero``, ``is_rank_0``), whose bodies are not in the project;
* :func:`rank_zero_decorator` — ``@rank_zero_only`` and its kin: the function runs on rank 0.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("gpu = int(os.environ['LOCAL_RANK'])\\nif gpu == 0: pass\\n")
    >>> facts = ModuleFacts(tree)
    >>> guard_locality(facts, tree.body[1].test, facts.module_scope)
    'local'
"""

from __future__ import annotations

import ast
import re

from gpu_training.diagnostics.lint.group_rank import group_rank_keys, spawn_index_keys
from gpu_training.diagnostics.lint.model import (
    RANK_ATTRS,
    ModuleFacts,
    Scope,
    call_name,
    dotted,
)
from gpu_training.diagnostics.lint.node_flags import switch_locality
from gpu_training.diagnostics.lint.passed_locality import passed_locality
from gpu_training.diagnostics.lint.rank_calls import rank_call
from gpu_training.diagnostics.lint.rank_name_loops import looped_rank_names

__all__ = ["CURRENT_DEVICE", "FLAG_NAMES", "guard_locality", "rank_zero_decorator"]

# Flags of frameworks and installed packages, whose bodies are not in the project.
FLAG_NAMES = re.compile(
    r"^(is_(local_|global_|world_|node_)?(main|master|primary|chief)(_process|_rank|_worker"
    r"|_node|_gpu|_device)?|(local_|global_)?(main|master)_process"
    r"|(is_|on_)?(global_)?(rank|process)_?(0|zero)"
    r"|is_global_zero|is_world_process_zero|is_local_process_zero|is_last_process)$"
)
RANK_ZERO_DECORATORS = re.compile(
    r"^(rank_?(0|zero)(_only)?|(main|master)(_process)?_only|on_(local_)?main_process"
    r"|on_rank_?(0|zero)|only_(on_)?(rank_?(0|zero)|main|master)(_process)?)$"
)
_LOCAL_NAME = re.compile(r"local|node")
_LOCAL_CALLS = frozenset({"get_local_rank", "get_node_local_rank"})
CURRENT_DEVICE = frozenset({"torch.cuda.current_device"})
"""The GPU index the process was pinned to (``set_device(local_rank)``, which torchrun scripts,
Accelerate and the Hugging Face Trainer do): the node-local rank, so
``torch.cuda.current_device() == 0`` holds on local rank 0 of every node."""


def rank_zero_decorator(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The decorator that runs a function on rank 0 only (Lightning's ``@rank_zero_only``,
    ``@master_only``, Accelerate's ``@accelerator.on_main_process``), if any.

    Example:
        >>> import ast
        >>> rank_zero_decorator(ast.parse("@rank_zero_only\\ndef f(): pass").body[0])
        'rank_zero_only'
    """
    for decorator in func.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = _tail(dotted(target))
        if RANK_ZERO_DECORATORS.match(name.lower()):
            return name
    return None


def guard_locality(facts: ModuleFacts, test: ast.AST, scope: Scope, depth: int = 0) -> str | None:
    """Which rank a guard reads: ``"local"`` (the rank within the node: ``local_rank == 0``
    holds once per node), ``"global"``, or None (no rank).

    A test that reads both (``rank == 0 and local_rank == 0``) is global.

    Example:
        >>> import ast
        >>> from gpu_training.diagnostics.lint.model import ModuleFacts
        >>> tree = ast.parse("gpu = int(os.environ['LOCAL_RANK'])\\nif gpu == 0: pass\\n")
        >>> facts = ModuleFacts(tree)
        >>> guard_locality(facts, tree.body[1].test, facts.module_scope)
        'local'
    """
    if depth > 4:
        return None
    found: set[str] = set()
    modulo = {
        id(sub)
        for node in ast.walk(test)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod)
        for sub in ast.walk(node.left)
    }
    callees = {
        id(n.func)
        for n in ast.walk(test)
        if isinstance(n, ast.Call) and _leaf_locality(facts, n, scope, depth) is not None
    }
    for node in ast.walk(test):
        if id(node) in callees and isinstance(node, (ast.Attribute, ast.Name)):
            continue  # `dist.get_rank` in `dist.get_rank(group=g)`, `is_main(args.local_rank)`
        where = _leaf_locality(facts, node, scope, depth)
        if where == "global" and id(node) in modulo:
            where = "local"  # `rank % ngpus_per_node`: the index within the node
        if where is not None:
            found.add(where)
    if "global" in found:
        return "global"
    return "local" if found else None


def _leaf_locality(facts: ModuleFacts, node: ast.AST, scope: Scope, depth: int) -> str | None:
    if isinstance(node, ast.Constant):
        if node.value in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
            return "local"
        if node.value in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
            return "global"
        return None
    if isinstance(node, ast.Call):
        summaries = facts.summaries(node)
        if summaries:
            kinds = {("local" if s.local else "global") for s in summaries if s.rank0}
            kinds |= {s.rank_value for s in summaries if s.rank_value}
            return "global" if "global" in kinds else ("local" if kinds else None)
        name = call_name(node, facts.imports)
        last = _tail(name)
        if last == "get_local_rank" and (node.args or node.keywords):
            return "global"  # `gpc.get_local_rank(ParallelMode.DATA)`: the rank in that group
        if (
            last in _LOCAL_CALLS
            or name in CURRENT_DEVICE
            or (rank_call(name) and last == "local_rank")
        ):
            return "local"  # ... or Horovod's `hvd.local_rank()`
        group = (
            node.args[0]
            if node.args
            else next((k.value for k in node.keywords if k.arg == "group"), None)
        )
        if last == "get_rank" and group is not None and not _default_group(facts, group, scope):
            return "local"  # `dist.get_rank(group=_LOCAL_PROCESS_GROUP)`: a rank in a subgroup
        return "global" if rank_call(name) else None
    key_index = node.slice if isinstance(node, ast.Subscript) else None
    if isinstance(key_index, ast.Constant) and isinstance(key_index.value, str):
        name = key_index.value.lower()  # `config["local_rank"]`
        local = "rank" in name and _LOCAL_NAME.search(name)
        return "local" if local else ("global" if "rank" in name else None)
    if not isinstance(node, (ast.Name, ast.Attribute)):
        return None
    name = _tail(dotted(node)).lower()
    if not name:
        return None
    is_rankish = "rank" in name or name in RANK_ATTRS or FLAG_NAMES.match(name) is not None
    if dotted(node) in spawn_index_keys(facts):
        return "local"  # `mp.spawn(worker)`'s process index: the index within the node
    if dotted(node) in group_rank_keys(facts):
        return (
            "global"  # `init_process_group(rank=local_rank)`: the group's rank, whatever its name
        )
    if is_rankish and _LOCAL_NAME.search(name):
        bound = _bound_locality(facts, node, scope, depth)
        return bound or "local"  # `local_rank = dist.get_rank()`: the value, not the name
    key = dotted(node)
    if key is not None and (isinstance(node, ast.Name) or key.startswith("self.")):
        every = facts.lookup(key, scope, _start(node))
        values = [v for v in every if v is not None]
        if isinstance(node, ast.Name):
            values += _multi_node_branch(facts, node.id, scope, values, depth)
        own = key.startswith("self.")  # `self.rank = rank`: the value lives in its method
        if values:
            inner = {
                guard_locality(facts, v, facts.scope_containing(v) if own else scope, depth + 1)
                for v in values
            } - {None}
            if inner:
                return "global" if "global" in inner else "local"
            switched = switch_locality(facts, values, depth, guard_locality)
            if switched is not None:
                return switched  # `self.print = True` under `if local_rank == 0:`
        elif every and isinstance(node, ast.Name):
            if names := looped_rank_names(facts, node, scope):
                return _leaf_locality(facts, names[0], scope, depth)  # the first one set
            passed = passed_locality(facts, node.id, scope, depth, guard_locality)
            if passed is not None:
                return passed  # `def __init__(self, rank)`, every caller passing LOCAL_RANK
    return "global" if is_rankish else None


def _default_group(facts: ModuleFacts, group: ast.expr, scope: Scope) -> bool:
    """The group argument is the default (world) one: ``dist.group.WORLD``, a
    ``get_default_group()`` call, or a ``group=None`` parameter that holds only such a value
    (a ``get_rank(group=None)`` wrapper that fills in the default group)."""
    values: list[ast.expr | None] = [group]
    if isinstance(group, ast.Name):
        values = facts.lookup_all(group.id, scope)
    return bool(values) and all(
        value is None  # a parameter: its callers pass none (the wrapper's own default)
        or (isinstance(value, ast.Attribute) and value.attr == "WORLD")
        or (isinstance(value, ast.Call) and _tail(dotted(value.func)).endswith("default_group"))
        for value in values
    )


def _bound_locality(facts: ModuleFacts, node: ast.AST, scope: Scope, depth: int) -> str | None:
    """Which rank a rank-named variable holds, read from what it is bound to, where that is known.

    ``local_rank = dist.get_rank()`` holds the global rank whatever its name, and ``rank =
    int(os.environ["LOCAL_RANK"])`` the node-local one. Only a value read from the launcher or
    the library decides (a rank call, a rank environment variable, Accelerate's
    ``process_index``, directly or through a variable bound to one); a parameter or an argparse
    field is unknown (None), and the caller reads the name.
    """
    key = dotted(node)
    if depth > 4 or key is None or not (isinstance(node, ast.Name) or key.startswith("self.")):
        return None
    values = [v for v in facts.lookup(key, scope, _start(node)) if v is not None]
    own = key.startswith("self.")
    found: set[str] = set()
    for value in values:
        where = _known_value(facts, value, facts.scope_containing(value) if own else scope, depth)
        if where is None:
            return None  # one binding of unknown origin: the name decides
        found.add(where)
    if not found:
        return None
    return "global" if "global" in found else "local"


def _known_value(facts: ModuleFacts, value: ast.expr, scope: Scope, depth: int) -> str | None:
    """The locality of one bound value from its library/launcher sources alone, else None."""
    modulo = {
        id(sub)
        for n in ast.walk(value)
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
        for sub in ast.walk(n.left)
    }
    found: set[str] = set()
    for sub in ast.walk(value):
        where: str | None = None
        if isinstance(sub, (ast.Call, ast.Constant)):
            where = _leaf_locality(facts, sub, scope, depth + 1)
        elif isinstance(sub, ast.Attribute) and sub.attr in RANK_ATTRS:
            where = "local" if _LOCAL_NAME.search(sub.attr) else "global"
        elif isinstance(sub, ast.Name):
            where = _bound_locality(facts, sub, scope, depth + 1)
        if where == "global" and id(sub) in modulo:
            where = "local"  # `dist.get_rank() % torch.cuda.device_count()`
        if where is not None:
            found.add(where)
    if not found:
        return None
    return "global" if "global" in found else "local"


def _multi_node_branch(
    facts: ModuleFacts, name: str, scope: Scope, values: list[ast.expr], depth: int
) -> list[ast.expr]:
    """The other branch's values of ``name`` when the branch chosen is the single-node one.

    ``if "SLURM_PROCID" in os.environ: rank = procid * gpus + local_rank`` / ``else: rank =
    local_rank``: the test reads a global rank, so the else runs one node and ``rank`` is global
    on every path (the lookup alone sees the last binding, the else's local rank).
    """
    key = ("branch-bindings", id(scope.node), name)
    branches = facts.memo.get(key)
    if not isinstance(branches, list):
        ifs_key = ("if-else", id(scope.node))
        ifs = facts.memo.get(ifs_key)
        if not isinstance(ifs, list):  # once per scope: each name reads the same `if`s
            ifs = [s for s in ast.walk(scope.node) if isinstance(s, ast.If) and s.orelse]
            facts.memo[ifs_key] = ifs
        branches = [
            (stmt, _assigned(stmt.body, name), _assigned(stmt.orelse, name)) for stmt in ifs
        ]
        facts.memo[key] = branches
    found: list[ast.expr] = []
    for stmt, body, orelse in branches:
        if not body or not orelse or not any(v in values for v in (*body, *orelse)):
            continue
        if guard_locality(facts, stmt.test, scope, depth + 1) == "global":
            found += [v for v in (*body, *orelse) if v not in values]
    return found


def _assigned(block: list[ast.stmt], name: str) -> list[ast.expr]:
    """The values a block binds ``name`` to in its own statements."""
    return [
        stmt.value
        for stmt in block
        if isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    ]


def _tail(name: str | None) -> str:
    return "" if name is None else name.rsplit(".", 1)[-1]


def _start(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
