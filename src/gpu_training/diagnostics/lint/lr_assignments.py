"""``GT014``: an assignment to an optimizer's learning rate under a rank guard.

``group['lr'] = new_lr`` on rank 0 only leaves the ranks stepping with different learning
rates. The same subscript on a dictionary the function builds itself — a logging dict for
TensorBoard, a progress bar's postfix — or takes from a call that reads no ``param_groups``
(``metrics = train_step(...)``) changes nothing of the optimizer:

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("def log(opt, lr):\\n"
    ...                  "    stats = {'loss': 1.0}\\n"
    ...                  "    stats['lr'] = lr\\n"
    ...                  "    opt.param_groups[0]['lr'] = lr\\n")
    >>> facts = ModuleFacts(tree)
    >>> func = tree.body[0]
    >>> scope = facts.scopes[func]
    >>> [[d for _, d in rank_dependent_assignments(s, scope)] for s in func.body[1:]]
    [[], ["['lr'] set"]]
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import Scope

__all__ = ["rank_dependent_assignments"]

_LR_KEYS = ("lr", "learning_rate")


def _built_dict(value: ast.expr | None) -> bool:
    """``{...}``, ``{k: v for ...}`` or ``dict(...)``: a fresh dictionary, not a param group."""
    if isinstance(value, (ast.Dict, ast.DictComp)):
        return True
    return (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict"
    )


def _returned_dict(value: ast.expr | None) -> bool:
    """What a call returns (``metrics = train_step(...)``) that reads no ``param_groups``: the
    function's own dictionary, not one of the optimizer's groups."""
    return isinstance(value, ast.Call) and "param_groups" not in ast.unparse(value)


def _local_dict(container: ast.expr, scope: Scope | None) -> bool:
    """Whether every binding of the subscripted name in its scope builds a fresh dictionary
    or takes one a call returns."""
    if scope is None or not isinstance(container, ast.Name):
        return False
    found = scope.bindings.get(container.id, [])
    return bool(found) and all(_built_dict(value) or _returned_dict(value) for _, value in found)


def rank_dependent_assignments(
    stmt: ast.stmt, scope: Scope | None = None
) -> list[tuple[ast.expr, str]]:
    """``GT014`` for a statement under a rank guard: ``group['lr'] = ...`` and the like.

    Args:
        stmt: The statement.
        scope: Its scope; with it, a name bound only to dictionaries the function builds
            (``log = {...}``, ``dict(...)``) is a logging dict, not a param group.

    Returns:
        ``(target, detail)`` for each assignment to an ``['lr']``/``['learning_rate']`` key.
    """
    if not isinstance(stmt, (ast.Assign, ast.AugAssign)):
        return []
    found: list[tuple[ast.expr, str]] = []
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    for target in targets:
        if not isinstance(target, ast.Subscript) or _local_dict(target.value, scope):
            continue
        key = target.slice
        if isinstance(key, ast.Constant) and key.value in _LR_KEYS:
            found.append((target, f"['{key.value}'] set"))
    return found
