"""A call whose value is only shown: formatted into a message, printed or logged (``GT014``).

``GT014`` reads a call named for the learning rate under a rank guard as a change of it
(``adjust_learning_rate(optimizer, epoch)`` on rank 0 only). A getter of the same words,
``model.current_learning_rate()`` in ``"lr:{:.3e}".format(...)`` inside a rank-0 log block,
changes nothing: its value goes into the message and nowhere else (a random sample's reader:
false). So a call whose value flows, through expressions only, into a format string, an
f-string, ``%``-formatting, ``print`` or a logging call is a read.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> facts = ModuleFacts(ast.parse("logger.info('lr {}'.format(m.current_learning_rate()))"))
    >>> call = [c for c in facts.calls if ast.unparse(c) == "m.current_learning_rate()"][0]
    >>> displayed_only(call, facts)
    True
    >>> facts = ModuleFacts(ast.parse("lr = adjust_learning_rate(opt, epoch)"))
    >>> displayed_only(facts.calls[0], facts)
    False
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import parents
from gpu_training.diagnostics.lint.model import ModuleFacts, dotted

__all__ = ["displayed_only"]

_SHOWN_BY = frozenset({"print", "format", "info", "debug", "warning", "error", "log", "write"})
"""Callees whose arguments are shown: ``print``, ``str.format``, a logger's methods, a
stream's ``write``."""


def displayed_only(call: ast.Call, facts: ModuleFacts) -> bool:
    """Whether ``call``'s value only goes into a message (see the module docstring)."""
    up = parents(facts)
    node: ast.AST = call
    while True:
        parent = up.get(id(node))
        if parent is None or isinstance(parent, ast.stmt):
            return False
        if isinstance(parent, ast.JoinedStr):
            return True
        if (
            isinstance(parent, ast.BinOp)
            and isinstance(parent.op, ast.Mod)
            and isinstance(parent.left, (ast.Constant, ast.JoinedStr))
            and node is parent.right
        ):
            return True
        if isinstance(parent, ast.Call) and node is not parent.func:
            callee = dotted(parent.func) or (
                parent.func.attr if isinstance(parent.func, ast.Attribute) else ""
            )
            if callee.rsplit(".", 1)[-1] in _SHOWN_BY:
                return True
        node = parent
