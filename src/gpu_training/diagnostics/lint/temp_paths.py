"""Paths inside a temporary directory of the process's own (``GT007``).

``tempfile.TemporaryDirectory()``, ``mkdtemp()`` and ``NamedTemporaryFile()`` give every process
a fresh private path, so a file written there is no file that every rank writes, however many
names and calls stand between the temporary directory and the write: ``Path(root) / name``
where ``root`` is a parameter every caller passes the ``as tmpdir`` of a ``with
tempfile.TemporaryDirectory()``.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("import tempfile\\nfrom pathlib import Path\\n"
    ...        "def write(root, files):\\n"
    ...        "    for name, data in files.items():\\n"
    ...        "        (Path(root) / name).write_bytes(data)\\n"
    ...        "def restore(files):\\n"
    ...        "    with tempfile.TemporaryDirectory() as tmp:\\n"
    ...        "        write(tmp, files)\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> func = facts.tree.body[2]
    >>> call = func.body[0].body[0].value
    >>> private_temp_path(facts, call.func.value, facts.scope_of(func))
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.answers import answers
from gpu_training.diagnostics.lint.calls import keyword_arg
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["private_temp_path"]

_MAX_DEPTH = 4


def private_temp_path(facts: ModuleFacts, expr: ast.expr, scope: Scope, depth: int = 0) -> bool:
    """Whether a path is built from a temporary file or directory of this process: directly,
    through a name bound to one, or through a parameter that every caller (in this file or in
    another module of the project) passes one.

    Args:
        facts: The file's facts.
        expr: The path expression.
        scope: Where it appears.
        depth: How many names and calls were followed already.

    Returns:
        True when some part of the path is such a temporary location.
    """
    if facts.kinds(expr, scope) & {"tempfile"}:
        return True
    if depth > _MAX_DEPTH:
        return False
    kept = answers(facts.memo)  # a path rebound many times: each binding once per depth
    key = ("private-temp-path", id(expr), id(scope.node), depth)
    known = kept.get(key)
    if not isinstance(known, bool):
        kept[key] = False  # a name bound to itself: no temporary path along this way
        known = kept[key] = _names_with_temp(facts, expr, scope, depth)
    return known


def _names_with_temp(facts: ModuleFacts, expr: ast.expr, scope: Scope, depth: int) -> bool:
    for node in ast.walk(expr):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        values = facts.lookup_all(node.id, scope)
        if any(v is not None and private_temp_path(facts, v, scope, depth + 1) for v in values):
            return True
        func = scope.node
        is_param = None in values and isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
        if is_param and _every_caller_passes_temp(facts, func, node.id, depth):  # type: ignore[arg-type]
            return True
    return False


def _every_caller_passes_temp(
    facts: ModuleFacts, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, depth: int
) -> bool:
    """Whether the function is called, and every call passes parameter ``name`` a temporary
    path of the caller's own."""
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    if name not in params:
        return False
    index = params.index(name) - (1 if params and params[0] in ("self", "cls") else 0)
    calls: list[tuple[ModuleFacts, ast.Call, Scope]] = [
        (facts, sub, where) for sub, where in facts.calls_of(func)
    ]
    if facts.resolver is not None:
        calls += facts.resolver.incoming((facts, func))
    if not calls:
        return False
    for owner, sub, where in calls:
        value = keyword_arg(sub, name)
        if value is None and 0 <= index < len(sub.args):
            value = sub.args[index]
        if value is None or not private_temp_path(owner, value, where, depth + 1):
            return False
    return True
