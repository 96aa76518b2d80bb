"""Whether a value is built with the rank: a path per rank is no shared write.

``rank_in_value`` follows a value's names through their bindings, the loops that bind them
and the callers that pass them (a few steps), for ``GT007``/``GT017`` and the node-local
writes: ``f"ckpt_{rank}.pt"``, ``suffix = f"-{rank}"`` then ``log + suffix``, a parameter
some caller passes a rank-built value.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> facts = ModuleFacts(ast.parse("suffix = f'-{rank}'\\npath = 'log' + suffix\\n"))
    >>> rank_in_value(facts, ast.parse("path", mode="eval").body, facts.module_scope)
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import keyword_arg
from gpu_training.diagnostics.lint.loop_items import loop_sources
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["rank_in_value"]

_Func = ast.FunctionDef | ast.AsyncFunctionDef


def rank_in_value(facts: ModuleFacts, expr: ast.expr, scope: Scope, depth: int = 0) -> bool:
    """Whether a value (a path) is built with the rank anywhere along its names: directly
    (``f"ckpt_{rank}.pt"``), through a name bound to such a value, or through a parameter
    some caller in the file passes one (``log_suffix = "-rank%03i" % rank`` two calls up).

    Each answer is kept per (value, scope, depth): a script that rebinds its names many
    times (``text = text + ...``) made the walk exponential in them."""
    if facts.mentions_rank(expr):
        return True
    if depth > 6:  # a path, its parts, a loop item, a parameter, the caller's value
        return False
    key = ("rank-in-value", id(expr), id(scope.node), depth)
    known = facts.memo.get(key)
    if isinstance(known, bool):
        return known
    facts.memo[key] = False  # a name bound to itself: no rank along this path
    found = facts.memo[key] = _names_with_rank(facts, expr, scope, depth)
    return found


def _names_with_rank(facts: ModuleFacts, expr: ast.expr, scope: Scope, depth: int) -> bool:
    for node in ast.walk(expr):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        values = facts.lookup_all(node.id, scope)
        if any(v is not None and rank_in_value(facts, v, scope, depth + 1) for v in values):
            return True
        if None in values and any(  # `for idx in my_indices`: one of this rank's items
            rank_in_value(facts, s, scope, depth + 1) for s in loop_sources(facts, node.id, scope)
        ):
            return True
        func = scope.node
        is_param = None in values and isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
        if is_param and _passed_with_rank(facts, func, node.id, depth):  # type: ignore[arg-type]
            return True
    return False


def _passed_with_rank(facts: ModuleFacts, func: _Func, name: str, depth: int) -> bool:
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    if name not in params:
        return False
    index = params.index(name) - (1 if params and params[0] in ("self", "cls") else 0)
    for sub, where in facts.calls_of(func):
        value = keyword_arg(sub, name)
        if value is None and 0 <= index < len(sub.args):
            value = sub.args[index]
        if value is not None and rank_in_value(facts, value, where, depth + 1):
            return True
    return False
