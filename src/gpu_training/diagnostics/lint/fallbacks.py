"""Rank-0 predicates with a fallback for the run without a process group.

Projects write "am I the main process" as a rank test on the distributed path and a constant
elsewhere: ``return get_rank() == 0 if dist.is_initialized() else True``, ``rank == 0 if
config.ddp else True``, ``True if world_size == 1 else rank == 0``. Such a value holds on rank
0 only in every run where a process group exists *if* the test that picks the rank branch is
true whenever several processes run. That is decided by what the test is, not how it is
spelled:

* a test of the group itself (``dist.is_initialized()``, ``world_size > 1``, a flag named for
  the group, ``args.distributed``, or a switch under which the file creates the group) -
  given by the caller as :data:`~gpu_training.diagnostics.lint.switches.MULTI` /
  :data:`~gpu_training.diagnostics.lint.switches.SINGLE`;
* a flag the project binds to one constant only (``ddp = True`` in ``config.py``, never
  assigned elsewhere): the branch it picks is the only one that runs.

A user option that may be off while a launcher starts every process (``args.use_ddp`` from
the command line, a flag assigned both values) is neither: with it off, every process takes
the constant branch and every rank writes, so the value is no rank-0 guard.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Protocol

from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted
from gpu_training.diagnostics.lint.switches import MULTI, SINGLE

__all__ = [
    "SINGLE_PROCESS_ATTRS",
    "constant_flag",
    "fallback_kind",
    "group_query_call",
    "group_test",
    "means_group",
]

SINGLE_PROCESS_ATTRS = frozenset({"is_initialized", "is_distributed", "is_available"})
"""Calls whose truth says a process group exists (``dist.is_initialized()``)."""
_LAUNCH_MODE = re.compile(r"multiprocessing|spawn|(^|_)mp(_|$)|launcher|slurm")

_MAX_VALUES = 8  # a name assigned in more places than this is no configuration constant


def means_group(flag: str) -> bool:
    """A flag that says a process group exists (``args.distributed``, ``is_distributed``), not
    one that says how the processes were started (``multiprocessing_distributed``: spawned
    by the script; without it a run can still be distributed, launched per node)."""
    lowered = flag.lower()
    return "distributed" in lowered and not _LAUNCH_MODE.search(lowered)


def group_test(test: ast.expr, kind: str | None) -> str | None:
    """Whether a test holds in every process of a group (``MULTI``) or only without one
    (``SINGLE``): its guard kind when it has one, else a group query or a group flag read
    positively (``dist.is_initialized()``, ``args.distributed``) or negated."""
    if kind in (MULTI, SINGLE):
        return kind
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    inner = test.operand if isinstance(test, ast.UnaryOp) and negated else test
    callee = inner.func if isinstance(inner, ast.Call) else inner
    last = (dotted(callee) or "").rsplit(".", 1)[-1]
    if last in SINGLE_PROCESS_ATTRS or (not isinstance(inner, ast.Call) and means_group(last)):
        return SINGLE if negated else MULTI
    return None


def group_query_call(facts: ModuleFacts, call: ast.expr, depth: int = 0) -> bool:
    """A call of a function of the project that returns only whether a process group exists
    (``def is_dist(): return dist.is_available() and dist.is_initialized()``), however it is
    named: ``not is_dist()`` then holds only without a group, as ``not dist.is_initialized()``.

    Example:
        >>> src = ("import torch.distributed as dist\\n"
        ...        "def is_dist():\\n    return dist.is_available() and dist.is_initialized()\\n"
        ...        "x = is_dist()\\n")
        >>> facts = ModuleFacts(ast.parse(src))
        >>> group_query_call(facts, facts.tree.body[2].value)
        True
    """
    if not isinstance(call, ast.Call) or call.args or call.keywords or depth > 3:
        return False
    refs = facts.callees(call)
    if not refs:
        return False
    for owner, func in refs:
        nodes = owner.scope_nodes.get(func, [])
        returns = [n.value for n in nodes if isinstance(n, ast.Return)]
        if not returns or not all(_group_query(owner, v, depth) for v in returns):
            return False
    return True


def _group_query(facts: ModuleFacts, value: ast.expr | None, depth: int) -> bool:
    """``dist.is_initialized()``, ``dist.is_available() and dist.is_initialized()``, or a
    call of a project function that returns one."""
    if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.And):
        return all(_group_query(facts, v, depth) for v in value.values)
    if not isinstance(value, ast.Call):
        return False
    last = (dotted(value.func) or "").rsplit(".", 1)[-1]
    return last in SINGLE_PROCESS_ATTRS or group_query_call(facts, value, depth + 1)


class _Modules(Protocol):
    def module_file(self, importer: str, module: str, level: int) -> Path | None: ...

    def facts_for(self, path: Path) -> ModuleFacts | None: ...


def _module_facts(facts: ModuleFacts, local: str) -> ModuleFacts | None:
    """The project module an imported name stands for (``import config``, ``from src import
    config``), when the project has it."""
    origin = facts.imports.origins.get(local)
    resolver = facts.resolver
    if origin is None or not hasattr(resolver, "module_file"):
        return None
    modules: _Modules = resolver  # type: ignore[assignment]
    module, level, symbol = origin
    names = [f"{module}.{symbol}".lstrip(".") if symbol else module]
    for name in names:
        path = modules.module_file(facts.path, name, level)
        if path is not None and path.is_file():
            return modules.facts_for(path)
    return None


def _bound_values(facts: ModuleFacts, expr: ast.expr, scope: Scope) -> list[ast.expr | None]:
    """Every value the project binds to a name or a module attribute (empty: unknown)."""
    key = dotted(expr)
    if key is None:
        return []
    if isinstance(expr, ast.Name):
        values = facts.lookup_all(key, scope)
        origin = facts.imports.origins.get(key)
        symbol = None if origin is None else origin[2]
        if origin is not None and symbol is not None:  # `from config import ddp`
            module, level = origin[0], origin[1]
            resolver = facts.resolver
            if not hasattr(resolver, "module_file"):
                return []
            modules: _Modules = resolver  # type: ignore[assignment]
            path = modules.module_file(facts.path, module, level)
            owner = modules.facts_for(path) if path is not None and path.is_file() else None
            if owner is None:
                return []
            values = [v for v in values if v is not None]
            values += [v for _, v in owner.module_scope.bindings.get(symbol, [])]
        return values
    if not isinstance(expr, ast.Attribute) or not isinstance(expr.value, ast.Name):
        return []
    owner = _module_facts(facts, expr.value.id)
    if owner is None:
        return []
    values = [v for _, v in owner.module_scope.bindings.get(expr.attr, [])]
    if facts.resolver is not None:  # `config.ddp = False` written by some script
        values += [v for _, _, v in facts.resolver.attribute_values(expr.attr)]
    return values


def constant_flag(facts: ModuleFacts, expr: ast.expr, scope: Scope) -> bool | None:
    """The one truth value a flag of the project can have, or None when it may differ.

    Args:
        facts: The module's facts (with its project, if any).
        expr: The flag as read (``config.ddp``, ``not USE_DDP``, ``True``).
        scope: Where it is read.

    Returns:
        True or False when every binding in the project gives that constant, else None
        (a command-line option, a flag assigned two values, a value computed at run time).
    """
    if isinstance(expr, ast.Constant):
        return bool(expr.value)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        inner = constant_flag(facts, expr.operand, scope)
        return None if inner is None else not inner
    if not isinstance(expr, (ast.Name, ast.Attribute)):
        return None
    values = _bound_values(facts, expr, scope)
    if not values or len(values) > _MAX_VALUES:
        return None
    if not all(isinstance(v, ast.Constant) for v in values):
        return None
    truths = {bool(v.value) for v in values if isinstance(v, ast.Constant)}
    return truths.pop() if len(truths) == 1 else None


def fallback_kind(
    facts: ModuleFacts,
    value: ast.IfExp,
    scope: Scope,
    sides: tuple[str | None, str | None],
    test_kind: str | None,
    rank0: str,
) -> bool:
    """Whether ``a if test else b`` holds on rank 0 only wherever a group exists.

    Args:
        facts: The module's facts.
        value: The conditional expression.
        scope: Where it appears.
        sides: How ``a`` and ``b`` depend on the rank (the guard kinds of the caller).
        test_kind: How ``test`` reads as a guard (``MULTI``: true in every process of a
            group; ``SINGLE``: true only without one).
        rank0: The caller's kind for "rank 0 only".

    Returns:
        True when one side is the rank-0 test and the other a constant or a
        no-group test, and the test picks the rank-0 side in every multi-process run.
    """
    body, orelse = sides
    if rank0 not in sides:
        return False
    picks_rank = constant_flag(facts, value.test, scope)
    if picks_rank is not None:  # a configuration constant: only one side ever runs
        return picks_rank == (body == rank0)
    other_kind, other = (orelse, value.orelse) if body == rank0 else (body, value.body)
    other_truth = constant_flag(facts, other, scope)
    if other_truth is False:
        return True  # rank 0, or nobody
    if other_truth is None and other_kind != SINGLE:
        return False  # the other side holds on some processes of a group
    return group_test(value.test, test_kind) == (MULTI if body == rank0 else SINGLE)
