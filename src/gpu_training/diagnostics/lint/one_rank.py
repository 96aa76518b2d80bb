"""``if rank == 1:``: a test true on exactly one rank that is not rank 0 (:func:`single_rank`).

RPC scripts pick roles by rank (``if rank == 1: run_worker()``), and scripts split work
between named ranks (``if epoch == 0 and rank == 0: save(shards[:3])`` / ``if epoch == 1 and
rank == 1: save(shards[3:])``): such a branch runs in one process, one writer of what it
writes. Kept apart from :mod:`~gpu_training.diagnostics.lint.guards`, whose rank reading it
uses.
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.guards import rank_derived
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["single_rank"]


def single_rank(facts: ModuleFacts, test: ast.expr, scope: Scope) -> bool:
    """``rank == 1``: a test true on exactly one rank (not 0), as RPC scripts pick roles; also
    a conjunction with such a test (``epoch == 1 and rank == 1``).

    Example:
        >>> import ast
        >>> from gpu_training.diagnostics.lint.model import ModuleFacts
        >>> facts = ModuleFacts(ast.parse(""))
        >>> single_rank(facts, ast.parse("rank == 1", mode="eval").body, facts.module_scope)
        True
    """
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):  # `epoch == 1 and rank == 1`
        return any(single_rank(facts, value, scope) for value in test.values)
    if not (
        isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
    ):
        return False
    left, right = test.left, test.comparators[0]
    if isinstance(left, ast.Constant):
        left, right = right, left
    return (
        isinstance(right, ast.Constant)
        and isinstance(right.value, int)
        and not isinstance(right.value, bool)
        and right.value > 0
        and rank_derived(facts, left, scope)
    )
