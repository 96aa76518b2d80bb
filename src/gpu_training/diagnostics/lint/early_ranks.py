"""A rank read before the process group exists: the fallback, the same on every rank.

``rank = dist.get_rank() if dist.is_initialized() else 0`` in a ``setup_logger()`` that
``main()`` calls before ``init_process_group()`` (or ``deepspeed.init_distributed()``, or a
``setup()`` helper that calls one) is ``0`` on every process: ``logs/train_rank0.log`` opened
with mode ``"w"`` is one path that every rank truncates and writes (``GT007``). A path built
with such a rank is shared when every call of its function comes, in the caller's block,
before the statement that creates the group.
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name

__all__ = ["rank_read_before_group"]

_CREATORS = frozenset({"init_process_group", "init_distributed"})
_PROBES = frozenset({"is_initialized", "is_available"})


def _creates_group(facts: ModuleFacts, stmt: ast.stmt) -> bool:
    for node in ast.walk(stmt):
        if not isinstance(node, ast.Call):
            continue
        if tail(call_name(node, facts.imports)) in _CREATORS:
            return True
        for owner, func in facts.callees(node):
            if any(
                isinstance(sub, ast.Call) and tail(call_name(sub, owner.imports)) in _CREATORS
                for sub in ast.walk(func)
            ):
                return True
    return False


def _fallback_rank(facts: ModuleFacts, expr: ast.expr, scope: Scope) -> bool:
    """``expr`` reads a name whose only value is ``<rank> if <is_initialized()> else <const>``."""
    for node in ast.walk(expr):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        values = facts.lookup_all(node.id, scope)
        if not values or not all(isinstance(v, ast.IfExp) for v in values):
            continue
        if all(
            isinstance(v, ast.IfExp)
            and isinstance(v.orelse, ast.Constant)
            and any(
                isinstance(c, ast.Call) and tail(call_name(c, facts.imports)) in _PROBES
                for c in ast.walk(v.test)
            )
            for v in values
        ):
            return True
    return False


def _before_creation(facts: ModuleFacts, call: ast.Call, where: Scope) -> bool:
    """The call's statement comes, in its block, before one that creates the group."""
    body = getattr(where.node, "body", None)
    if not isinstance(body, list):
        return False
    for index, stmt in enumerate(body):
        if any(sub is call for sub in ast.walk(stmt)):
            return not _creates_group(facts, stmt) and any(
                _creates_group(facts, later) for later in body[index + 1 :]
            )
        if _creates_group(facts, stmt):
            return False
    return False


def rank_read_before_group(facts: ModuleFacts, path: ast.expr, scope: Scope) -> bool:
    """Whether ``path``'s rank is a fallback read before the group exists (see the module).

    Args:
        facts: The file's facts.
        path: The written path (built with the rank).
        scope: The function that writes it.
    """
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    if not _fallback_rank(facts, path, scope) and not any(
        isinstance(n, ast.Name) and _fallback_rank(facts, v, scope)
        for n in ast.walk(path)
        if isinstance(n, ast.Name)
        for v in facts.lookup_all(n.id, scope)
        if v is not None
    ):
        return False
    sites = facts.calls_of(func)
    return bool(sites) and all(_before_creation(facts, c, where) for c, where in sites)
