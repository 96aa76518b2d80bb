"""A device index that a branch's test makes equal to the global rank (``GT018``).

Hand-written tensor or pipeline parallelism places each shard by looping over the parts and
keeping the one whose index is this process's: ``for i in range(tp): if dist.get_rank() ==
i: part[i].to(f"cuda:{i}")``. Inside that branch ``i`` *is* the global rank, so ``cuda:{i}``
names GPU ``rank``, which a second node does not have. The same holds after an early exit,
``if i != rank: continue``, and in the ``else:`` of ``if i != rank:``.

The finder reads only the tests of the statements that enclose the index in its own function
(an ``and`` of tests counts each part); whether the other side of the ``==`` is the global rank
is left to the caller (:func:`~gpu_training.diagnostics.lint.setup.global_rank_source`).

Example:
    >>> import ast
    >>> tree = ast.parse("for i in range(n):\\n    if i != rank:\\n        continue\\n    x.to(i)\\n")
    >>> use = tree.body[0].body[1].value.args[0]
    >>> [ast.unparse(side) for side in equal_sides(tree.body, use)]
    ['rank']
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpu_training.diagnostics.lint.context import terminates

__all__ = ["equal_sides", "fstring_values"]

_Block = list[ast.stmt]


def fstring_values(expr: ast.expr) -> list[ast.expr]:
    """Every value interpolated into an f-string device (``f"{device}:{i}"`` gives ``device``
    and ``i``): the index may be any of them. Anything else is returned as it is."""
    if not isinstance(expr, ast.JoinedStr):
        return [expr]
    return [v.value for v in expr.values if isinstance(v, ast.FormattedValue)]


def equal_sides(body: _Block, use: ast.expr) -> list[ast.expr]:
    """The expressions that the tests enclosing ``use`` (within ``body``) make equal to it.

    Args:
        body: The statements of the function (or module) ``use`` is in.
        use: The expression (a name or attribute) used as a device index.

    Returns:
        The other side of each ``use == X`` (or ``X == use``) that holds where ``use`` is:
        a test of an ``if`` whose body holds it, a ``!=`` test of an ``if`` whose ``else``
        holds it, or a ``!=`` test of an earlier ``if`` of the same block that always leaves.
    """
    text = ast.unparse(use)
    found: list[ast.expr] = []
    for block, index in _blocks_to(body, use):
        stmt = block[index]
        if isinstance(stmt, ast.If) and any(_holds(s, use) for s in stmt.body):
            found += _sides(stmt.test, text, ast.Eq)
        elif isinstance(stmt, ast.If) and any(_holds(s, use) for s in stmt.orelse):
            found += _sides(stmt.test, text, ast.NotEq)
        for earlier in block[:index]:
            if isinstance(earlier, ast.If) and not earlier.orelse and terminates(earlier.body):
                found += _sides(earlier.test, text, ast.NotEq)
    return found


def _holds(node: ast.AST, target: ast.AST) -> bool:
    return any(n is target for n in ast.walk(node))


def _blocks_to(body: _Block, target: ast.AST) -> Iterator[tuple[_Block, int]]:
    """Each block on the way down to ``target`` and the index of the statement holding it
    (nested functions and classes are not entered: they are scopes of their own)."""
    block: _Block | None = body
    while block is not None:
        index = next((i for i, s in enumerate(block) if _holds(s, target)), None)
        if index is None:
            return
        yield block, index
        stmt = block[index]
        block = None
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and any(_holds(s, target) for s in inner):
                if field == "handlers":
                    handler = next(h for h in inner if _holds(h, target))
                    block = handler.body
                else:
                    block = inner
                break


def _sides(test: ast.expr, text: str, op: type[ast.cmpop]) -> list[ast.expr]:
    """The other side of every ``text <op> X`` in ``test`` (each part of an ``and`` for
    ``==``; each part of an ``or`` for ``!=``, whose negation is an ``and``)."""
    joiner = ast.And if op is ast.Eq else ast.Or
    if isinstance(test, ast.BoolOp) and isinstance(test.op, joiner):
        return [side for part in test.values for side in _sides(part, text, op)]
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], op)):
        return []
    left, right = test.left, test.comparators[0]
    if ast.unparse(left) == text:
        return [right]
    if ast.unparse(right) == text:
        return [left]
    return []
