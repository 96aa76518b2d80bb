"""The names that hold the rank a process group was created with: the global rank, whatever
they are called (``GT017``).

``dist.init_process_group(..., rank=local_rank)`` makes ``local_rank`` this process's rank in
the group, its *global* rank, by definition: a guard ``if args.local_rank == 0:`` on that value
holds on one process of the whole job, not one per node. (A launch over several nodes that
passed the node-local index here would give two processes the same rank, and the group would
not form.) A spawn worker that creates a one-machine group from its spawn index is the common
case. A ``local_rank`` the launcher supplies (``LOCAL_RANK``, ``--local_rank``) keeps its
meaning, the index within the node: the script is written for a launch over nodes.

The names are read over the whole file: the ``rank=`` argument itself, the names bound to it
(``args.local_rank = local_rank``) and the names it is bound from (``rank = args.local_rank``).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("def worker(gpu, args):\\n    args.gpu = gpu\\n"
    ...        "    dist.init_process_group('nccl', rank=gpu, world_size=2)\\n")
    >>> sorted(group_rank_keys(ModuleFacts(ast.parse(src))))
    ['args.gpu', 'gpu']
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpu_training.diagnostics.lint.calls import call_arg, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted
from gpu_training.diagnostics.lint.state_saves import passed_at

__all__ = ["group_rank_keys", "spawn_index_keys"]

_RANK_POSITION = 4  # init_process_group(backend, init_method, timeout, world_size, rank, ...)


def group_rank_keys(facts: ModuleFacts) -> frozenset[str]:
    """The dotted names (``"gpu"``, ``"args.local_rank"``) that hold the ``rank=`` a process
    group of this file was created with (kept in ``facts.memo``)."""
    cached = facts.memo.get("group-rank-keys")
    if isinstance(cached, frozenset):
        return cached
    keys: set[str] = set()
    for call in facts.calls:
        if tail(call_name(call, facts.imports)) != "init_process_group":
            ranks = _helper_group_ranks(facts, call)
        elif (rank := call_arg(call, _RANK_POSITION, "rank")) is not None:
            ranks = [rank]
        else:  # `os.environ["RANK"] = str(local_rank)` before an env:// group
            ranks = list(_environ_ranks(facts.scope_containing(call).node))
        for rank in ranks:
            if isinstance(rank, ast.Call) and dotted(rank.func) == "int" and len(rank.args) == 1:
                rank = rank.args[0]  # `rank=int(rank)`: the same value
            key = dotted(rank) if rank is not None else None
            if key is not None and not _launcher_local(facts, key):
                keys.add(key)
    pairs = [
        (target_key, value_key)
        for node in facts.nodes
        if isinstance(node, ast.Assign) and (value_key := dotted(node.value)) is not None
        for target in node.targets
        if (target_key := dotted(target)) is not None
    ]
    grown = bool(keys)
    while grown:  # `args.local_rank = local_rank`, `rank = args.local_rank`: the same value
        before = len(keys)
        for target_key, value_key in pairs:
            if target_key in keys or value_key in keys:
                keys.update((target_key, value_key))
        grown = len(keys) > before
    result = frozenset(keys)
    facts.memo["group-rank-keys"] = result
    return result


def _helper_group_ranks(facts: ModuleFacts, call: ast.Call) -> list[ast.expr | None]:
    """What ``call`` passes a project helper that creates the group with that parameter as
    its rank (``init_process(rank, size)`` whose body calls ``init_process_group(backend,
    rank=rank, world_size=size)``, in this file or another module): the group's rank."""
    found: list[ast.expr | None] = []
    for owner, func in facts.callees(call):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.extend(passed_at(call, func, i) for i in _rank_parameters(owner, func))
    return found


def _rank_parameters(owner: ModuleFacts, func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[int]:
    """The positions (after ``self``/``cls``) of ``func``'s parameters that its body makes a
    process group's rank with, once per function (kept in its module's ``memo``: every call
    of a helper asks)."""
    key = ("group-rank-parameters", id(func))
    cached = owner.memo.get(key)
    if isinstance(cached, list):
        return cached
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    skip = 1 if params and params[0] in ("self", "cls") else 0
    positions: list[int] = []
    for inner in ast.walk(func):
        if not isinstance(inner, ast.Call) or tail(dotted(inner.func) or "") != (
            "init_process_group"
        ):
            continue
        rank = call_arg(inner, _RANK_POSITION, "rank")
        given = [rank] if rank is not None else list(_environ_ranks(func))
        for value in given:
            if isinstance(value, ast.Call) and dotted(value.func) == "int" and value.args:
                value = value.args[0]
            if isinstance(value, ast.Name) and value.id in params[skip:]:
                positions.append(params.index(value.id) - skip)
    owner.memo[key] = positions
    return positions


def _environ_ranks(node: ast.AST) -> Iterator[ast.expr]:
    """What ``node``'s body assigns to ``os.environ["RANK"]`` (through ``str()``/``int()``):
    the rank an ``env://`` process group of the same body is created with."""
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Assign) or len(sub.targets) != 1:
            continue
        target = sub.targets[0]
        if (
            isinstance(target, ast.Subscript)
            and dotted(target.value) in ("os.environ", "environ")
            and isinstance(target.slice, ast.Constant)
            and target.slice.value == "RANK"
        ):
            value = sub.value
            if isinstance(value, ast.Call) and dotted(value.func) in ("str", "int") and value.args:
                value = value.args[0]
            yield value


_LAUNCHER_LOCAL = frozenset({"LOCAL_RANK", "SLURM_LOCALID", "--local_rank", "--local-rank"})


def _launcher_local(facts: ModuleFacts, key: str) -> bool:
    """``rank=args.local_rank`` where the launcher supplies the index within the node (the file
    reads ``LOCAL_RANK`` or takes ``--local_rank``): the name keeps the launcher's meaning. The
    group forms only on one node (two nodes would give two processes the same rank), but the
    script is written for a launch over nodes, and its ``local_rank == 0`` guards mean one
    process per node - the flaw the fix (the global rank) removes in both places."""
    if "local" not in key.rsplit(".", 1)[-1].lower():
        return False
    cached = facts.memo.get("launcher-local")
    if not isinstance(cached, bool):
        cached = any(
            isinstance(n, ast.Constant) and n.value in _LAUNCHER_LOCAL for n in facts.nodes
        )
        facts.memo["launcher-local"] = cached
    return cached


def literal_group_rank(facts: ModuleFacts) -> bool:
    """Every process group of the file is created with a literal rank (``rank=0,
    world_size=4`` over TCP to a fixed host): the file runs one process per copy, each copy on
    its own machine, so a fixed ``cuda:0`` is not shared with another rank (``GT002``)."""
    cached = facts.memo.get("literal-group-rank")
    if isinstance(cached, bool):
        return cached
    inits = [c for c in facts.calls if tail(call_name(c, facts.imports)) == "init_process_group"]
    ranks = [call_arg(c, _RANK_POSITION, "rank") for c in inits]
    result = bool(ranks) and all(
        isinstance(r, ast.Constant) and isinstance(r.value, int) for r in ranks
    )
    facts.memo["literal-group-rank"] = result
    return result


def spawn_index_keys(facts: ModuleFacts) -> frozenset[str]:
    """The names that hold the process index ``torch.multiprocessing.spawn`` passes its target
    as first argument (``def main_worker(gpu, ngpus, args)``, ``args.gpu = gpu``): the index of
    the process on its machine, 0 on one process per node, unless the group was created with
    it as its rank (then :func:`group_rank_keys`: one machine, the global rank). Kept in
    ``facts.memo``.

    Example:
        >>> import ast
        >>> src = ("import torch.multiprocessing as mp\\n"
        ...        "def worker(gpu, opt):\\n    opt.gpu = gpu\\n"
        ...        "    dist.init_process_group('nccl', rank=opt.node * 8 + gpu)\\n"
        ...        "mp.spawn(worker, nprocs=8, args=(opt,))\\n")
        >>> sorted(spawn_index_keys(ModuleFacts(ast.parse(src))))
        ['gpu', 'opt.gpu']
    """
    cached = facts.memo.get("spawn-index-keys")
    if isinstance(cached, frozenset):
        return cached
    keys: set[str] = set()
    targets = {
        dotted(call.args[0])
        for call in facts.calls
        if call.args
        and "multiprocessing" in (name := call_name(call, facts.imports))
        and tail(name) in ("spawn", "start_processes")
    }
    for node in facts.nodes:
        if (
            not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            or node.name not in targets
        ):
            continue
        params = [*node.args.posonlyargs, *node.args.args]
        if not params:
            continue
        index = params[0].arg
        keys.add(index)
        for sub in ast.walk(node):  # `opt.gpu = gpu`: the same index under another name
            if isinstance(sub, ast.Assign) and dotted(sub.value) == index:
                keys.update(k for t in sub.targets if (k := dotted(t)) is not None)
    result = frozenset(keys - group_rank_keys(facts))
    facts.memo["spawn-index-keys"] = result
    return result
