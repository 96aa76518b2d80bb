"""A predicate written as a flag the function sets, read as the expression it computes.

Projects spell "am I the process that saves" imperatively as often as in one expression::

    def get_ddp_save_flag():
        flag_save = True
        if dist.is_initialized():
            if dist.get_rank() != 0:
                flag_save = False
        return flag_save

is ``dist.get_rank() == 0 if dist.is_initialized() else True``: the rank-0 predicate with its
fallback for the run without a group, which the guard readers already know
(:mod:`~gpu_training.diagnostics.lint.fallbacks`). :func:`flag_expression` builds that
expression from a body made only of constant assignments to the returned name, ``if``s around
them and statements that do not touch it; anything else (a loop, a ``return`` inside, the
name bound to something other than a constant) gives None.

Example:
    >>> import ast
    >>> func = ast.parse(
    ...     "def f():\\n    ok = True\\n    if dist.is_initialized():\\n"
    ...     "        if dist.get_rank() != 0:\\n            ok = False\\n    return ok\\n"
    ... ).body[0]
    >>> ast.unparse(flag_expression(func))
    'dist.get_rank() == 0 if dist.is_initialized() else True'
"""

from __future__ import annotations

import ast

__all__ = ["flag_expression"]

_NEGATED: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


def _negate(test: ast.expr) -> ast.expr:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _NEGATED:
        negated = ast.Compare(test.left, [_NEGATED[type(test.ops[0])]()], test.comparators)
        return ast.copy_location(negated, test)
    return ast.copy_location(ast.UnaryOp(ast.Not(), test), test)


def _choose(test: ast.expr, yes: ast.expr, no: ast.expr) -> ast.expr:
    """``yes if test else no``, with the constant cases folded (``True if t else False`` is
    ``t``)."""
    if ast.dump(yes) == ast.dump(no):
        return yes
    if isinstance(yes, ast.Constant) and isinstance(no, ast.Constant):
        if yes.value is True and no.value is False:
            return test
        if yes.value is False and no.value is True:
            return _negate(test)
    return ast.copy_location(ast.IfExp(test, yes, no), test)


def _touches(stmt: ast.stmt, name: str) -> bool:
    return any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del))
        for n in ast.walk(stmt)
    )


def _run(block: list[ast.stmt], name: str, value: ast.expr | None) -> ast.expr | None:
    for stmt in block:
        if isinstance(stmt, ast.Assign) and [_target(t) for t in stmt.targets] == [name]:
            if not isinstance(stmt.value, ast.Constant):
                return None
            value = stmt.value
        elif isinstance(stmt, ast.If) and _touches(stmt, name):
            if value is None:
                return None
            yes, no = _run(stmt.body, name, value), _run(stmt.orelse, name, value)
            if yes is None or no is None:
                return None
            value = _choose(stmt.test, yes, no)
        elif isinstance(stmt, (ast.Return, ast.For, ast.While, ast.Try, ast.With)):
            if _touches(stmt, name) or any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
                return None
        elif _touches(stmt, name):
            return None
    return value


def _target(target: ast.expr) -> str | None:
    return target.id if isinstance(target, ast.Name) else None


def flag_expression(func: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.expr | None:
    """The expression a function's flag holds at its one ``return flag`` (its last statement),
    or None when the body is not that shape (see the module's example)."""
    body = func.body
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    returned = body[-1].value
    if not isinstance(returned, ast.Name):
        return None
    if any(isinstance(n, ast.Return) for stmt in body[:-1] for n in ast.walk(stmt)):
        return None
    value = _run(body[:-1], returned.id, None)
    if value is None or isinstance(value, ast.Constant):
        return None
    return value
