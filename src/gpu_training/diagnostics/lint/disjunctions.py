"""What an ``if`` nested in ``if A or B:`` leaves to hold.

``if not path_to_cache or (not cache_hit and get_rank() == 0):`` is no rank guard by
itself (without a cache path every rank enters), but a nested ``if path_to_cache:`` rules
the first operand out: inside it only the second holds, here rank 0.
"""

from __future__ import annotations

import ast

__all__ = ["remaining_disjuncts"]


def _negates(a: ast.expr, b: ast.expr) -> bool:
    """Whether ``a`` is ``not b`` written out (or ``b`` is ``not a``)."""
    for x, y in ((a, b), (b, a)):
        if (
            isinstance(x, ast.UnaryOp)
            and isinstance(x.op, ast.Not)
            and ast.dump(x.operand) == ast.dump(y)
        ):
            return True
    return False


def remaining_disjuncts(disjunctions: tuple[ast.BoolOp, ...], test: ast.expr) -> ast.expr | None:
    """The operands of an enclosing ``or`` left to hold where ``test`` is true.

    Args:
        disjunctions: The ``A or B`` tests of the enclosing ifs, innermost last.
        test: The nested if's test.

    Returns:
        The other operands (one expression, or their ``or``) when ``test`` contradicts one
        operand of an enclosing disjunction; None otherwise.

    Example:
        >>> outer = ast.parse("not p or rank == 0", mode="eval").body
        >>> ast.unparse(remaining_disjuncts((outer,), ast.parse("p", mode="eval").body))
        'rank == 0'
    """
    for disjunction in reversed(disjunctions):
        for index, part in enumerate(disjunction.values):
            if _negates(part, test):
                rest = disjunction.values[:index] + disjunction.values[index + 1 :]
                if len(rest) == 1:
                    return rest[0]
                return ast.copy_location(ast.BoolOp(op=ast.Or(), values=rest), disjunction)
    return None
