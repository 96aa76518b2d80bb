"""Branches a launched script cannot take: ``rank == -1`` when ``rank`` is read with
``int(os.environ["LOCAL_RANK"])``.

Indexing ``os.environ`` without a default raises ``KeyError`` where no launcher set the
variable, so every run that gets past the read has a rank >= 0, and the ``rank == -1`` side
of a test on it (the single-process ``DataParallel`` fallback) never runs.
"""

from __future__ import annotations

import ast

__all__ = ["in_unlaunched_branch"]


def _minus_one(expr: ast.expr) -> bool:
    return (
        isinstance(expr, ast.UnaryOp)
        and isinstance(expr.op, ast.USub)
        and isinstance(expr.operand, ast.Constant)
        and expr.operand.value == 1
    )


def _read_from_launcher(scope_node: ast.AST, name: str) -> bool:
    """Whether every assignment of ``name`` in the scope is ``int(os.environ[...])``."""
    values = [
        node.value
        for node in ast.walk(scope_node)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]

    def launcher_read(value: ast.expr) -> bool:
        return (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "int"
            and len(value.args) == 1
            and isinstance(value.args[0], ast.Subscript)
            and ast.unparse(value.args[0].value) == "os.environ"
        )

    return bool(values) and all(launcher_read(v) for v in values)


def in_unlaunched_branch(scope_node: ast.AST, call: ast.AST) -> bool:
    """Whether ``call`` sits on the ``rank == -1`` side of a test on a launcher-read rank.

    Example:
        >>> tree = ast.parse(
        ...     "import os\\nrank = int(os.environ['LOCAL_RANK'])\\n"
        ...     "if rank != -1:\\n    m = DDP(m)\\nelse:\\n    m = DataParallel(m)\\n"
        ... )
        >>> in_unlaunched_branch(tree, tree.body[2].orelse[0].value)
        True
    """
    for node in ast.walk(scope_node):
        if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
            continue
        test = node.test
        if len(test.ops) != 1 or not isinstance(test.left, ast.Name):
            continue
        if not _minus_one(test.comparators[0]):
            continue
        if isinstance(test.ops[0], ast.NotEq):
            branch = node.orelse
        elif isinstance(test.ops[0], ast.Eq):
            branch = node.body
        else:
            continue
        inside = any(sub is call for stmt in branch for sub in ast.walk(stmt))
        if inside and _read_from_launcher(scope_node, test.left.id):
            return True
    return False
