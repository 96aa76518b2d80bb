"""``if rank != value:``: a test that holds on every rank but one (:func:`all_but_one`).

Scripts pick the one process that writes by name (``if dist.get_rank() != args.main_gpu:
save = False``); the branch runs on all the others. Kept apart from
:mod:`~gpu_training.diagnostics.lint.rank_flags` because it reads ranks through
:mod:`~gpu_training.diagnostics.lint.guards`, which imports that module.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> facts = ModuleFacts(ast.parse(""))
    >>> test = ast.parse("dist.get_rank() != args.main_gpu", mode="eval").body
    >>> all_but_one(facts, test, facts.module_scope)
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.guards import rank_derived
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["all_but_one"]


def all_but_one(facts: ModuleFacts, test: ast.expr, scope: Scope) -> bool:
    """``rank != value``: a rank compared unequal to one value that is not a rank, nor the
    ``-1``/``None`` of "not launched distributed" (``!= 0`` is already "not rank 0").

    Args:
        facts: The module's facts.
        test: An ``if`` test.
        scope: Where it is.

    Returns:
        Whether the test holds on every rank but one.
    """
    if not (
        isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.NotEq)
    ):
        return False
    left, right = test.left, test.comparators[0]
    if rank_derived(facts, right, scope) and not rank_derived(facts, left, scope):
        left, right = right, left
    if not rank_derived(facts, left, scope) or rank_derived(facts, right, scope):
        return False
    if isinstance(right, ast.UnaryOp) and isinstance(right.op, ast.USub):
        return False  # rank != -1: launched distributed
    return not (isinstance(right, ast.Constant) and (right.value is None or right.value == 0))
