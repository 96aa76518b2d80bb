"""A file every rank opens for appending but only rank 0 writes to: not a shared write.

``GT007`` reports an ``open(path, "w"/"a")`` that every rank runs. A logger class often
opens its file in ``__init__`` on every rank and writes through a method that tests the
rank (``if dist.get_rank() == 0: self.logout.write(...)``). Opened for appending, the other
ranks only create the file (appending truncates nothing), so one process writes it. The
handle is followed from the name or ``self.`` attribute the ``open(...)`` is bound to:
every use must be a write under a rank-0 guard, or a ``flush``/``close``. Anything else
(the handle handed to a library, returned, a write no guard covers) keeps the finding. A
``"w"`` open is not excused: a rank that opens it late truncates what rank 0 wrote.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("class Log:\\n    def __init__(self, path):\\n"
    ...        "        self.out = open(path, 'a')\\n"
    ...        "    def write(self, text):\\n        if dist.get_rank() == 0:\\n"
    ...        "            self.out.write(text)\\n")
    >>> tree = ast.parse(src)
    >>> facts = ModuleFacts(tree)
    >>> init = tree.body[0].body[0]
    >>> opened = init.body[0].value
    >>> appended_by_rank0_only(facts, opened, facts.scope_of(init))
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import call_arg
from gpu_training.diagnostics.lint.guards import GUARD_NOT_RANK0, GUARD_RANK0, classify_guard
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted

__all__ = ["appended_by_rank0_only", "one_literal_path"]

_WRITES = frozenset({"write", "writelines"})
_NEUTRAL = frozenset({"flush", "close", "closed", "name"})


def appended_by_rank0_only(facts: ModuleFacts, opened: ast.Call, scope: Scope) -> bool:
    """Whether an ``open(path, "a")`` bound to a name is written only under rank-0 guards.

    Args:
        facts: The module's facts.
        opened: The ``open(...)`` call.
        scope: The scope it is in.

    Returns:
        True when the mode appends, the handle is bound to a plain name or a ``self.``
        attribute, at least one write goes through it and every use of it is a write under
        a rank-0 guard (or a ``flush``/``close``); False otherwise.
    """
    mode = call_arg(opened, 1, "mode")
    if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and "a" in mode.value):
        return False
    handle = _bound_to(facts, opened, scope)
    if handle is None:
        return False
    region: ast.AST = scope.cls if handle.startswith("self.") and scope.cls else scope.node
    parents = {id(child): node for node in ast.walk(region) for child in ast.iter_child_nodes(node)}
    writes = 0
    for node in ast.walk(region):
        if not isinstance(node, (ast.Name, ast.Attribute)) or dotted(node) != handle:
            continue
        if not isinstance(node.ctx, ast.Load):
            continue  # the binding itself
        user = parents.get(id(node))
        if isinstance(user, ast.Attribute) and user.attr in _NEUTRAL:
            continue
        writing = isinstance(user, ast.Attribute) and user.attr in _WRITES
        if writing or (isinstance(user, ast.keyword) and user.arg == "file"):  # print(file=)
            call = parents.get(id(user))
        else:
            return False  # handed on, returned, iterated: where it writes is not shown
        if not isinstance(call, ast.Call) or not _under_rank0(facts, call, parents):
            return False
        writes += 1
    return writes > 0


def _bound_to(facts: ModuleFacts, opened: ast.Call, scope: Scope) -> str | None:
    """``self.logout = open(...)`` → ``"self.logout"``; ``log = open(...)`` → ``"log"``."""
    for node in facts.scope_nodes.get(scope.node, []):
        if isinstance(node, ast.Assign) and node.value is opened and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, (ast.Name, ast.Attribute)):
                return dotted(target)
    return None


def _under_rank0(facts: ModuleFacts, node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether an enclosing ``if`` runs ``node`` on rank 0 only."""
    child, parent = node, parents.get(id(node))
    while parent is not None and not isinstance(parent, ast.ClassDef):
        if isinstance(parent, ast.If):
            kind = classify_guard(facts, parent.test, facts.scope_containing(parent))
            in_body = any(child is stmt for stmt in parent.body)
            if (kind == GUARD_RANK0 and in_body) or (kind == GUARD_NOT_RANK0 and not in_body):
                return child is not parent.test
        child, parent = parent, parents.get(id(parent))
    return False


def one_literal_path(call: ast.Call) -> bool:
    """``image.save("debug.png")``: one argument, a file name written in the code (a
    framework's ``save(path, state)`` takes two)."""
    if len(call.args) != 1 or any(k.arg is None for k in call.keywords):
        return False
    arg = call.args[0]
    text = arg.value if isinstance(arg, ast.Constant) else None
    return isinstance(text, str) and "." in text.rsplit("/", 1)[-1]
