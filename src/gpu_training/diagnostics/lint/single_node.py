"""A script whose process group meets on this machine: single-node by construction (``GT018``).

A group whose rendezvous address the script itself fixes to the loopback interface
(``init_process_group(init_method="tcp://localhost:23456")``, ``os.environ["MASTER_ADDR"] =
"localhost"``, a ``tcp://127.0.0.1:...`` URL handed to the ``mp.spawn`` workers) can only gather
processes of this one machine: a second node's processes would dial their own loopback. Every
rank of such a group is on the node, so its global rank *is* the index of the GPU on the node,
and using it as a device index is sound, as ``mp.spawn``'s process index is. A loopback address
given only as a default (``add_argument("--dist-url", default="tcp://localhost:...")``,
``os.environ.get("MASTER_ADDR", "localhost")``, ``setdefault``) or set in one branch of an
``if`` is overridden by multi-node launches and proves nothing.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = "import torch.distributed as dist\\ndist.init_process_group('nccl', init_method='tcp://127.0.0.1:29500')\\n"
    >>> loopback_rendezvous(ModuleFacts(ast.parse(src)))
    True
    >>> src = "import os\\nos.environ.setdefault('MASTER_ADDR', 'localhost')\\n"
    >>> loopback_rendezvous(ModuleFacts(ast.parse(src)))
    False
"""

from __future__ import annotations

import ast
import re

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted

__all__ = ["loopback_rendezvous"]

_LOOPBACK_URL = re.compile(r"^tcp://(localhost|127\.0\.0\.1|\[::1\])(:|$)")
_LOOPBACK_HOST = frozenset({"localhost", "127.0.0.1", "::1"})
_DEFAULT_TAKERS = frozenset({"get", "getenv", "setdefault", "add_argument", "field"})


def loopback_rendezvous(facts: ModuleFacts) -> bool:
    """Whether the module fixes its process group's rendezvous to this machine's loopback.

    Args:
        facts: The module's facts.

    Returns:
        True for a loopback ``tcp://`` URL literal used other than as a default, or an
        unconditional ``os.environ["MASTER_ADDR"] = "localhost"``; kept in ``facts.memo``.
    """
    cached = facts.memo.get("loopback-rendezvous")
    if isinstance(cached, bool):
        return cached
    defaults = {
        id(value)
        for call in facts.calls
        if tail(call_name(call, facts.imports)) in _DEFAULT_TAKERS
        for value in (*call.args[1:], *(k.value for k in call.keywords if k.arg == "default"))
    }
    conditional = {
        id(sub)
        for node in facts.nodes
        if isinstance(node, (ast.If, ast.IfExp))
        for branch in _branches(node)
        for sub in ast.walk(branch)
    }
    found = any(
        _loopback(facts, node)
        for node in facts.nodes
        if id(node) not in defaults and id(node) not in conditional
    )
    facts.memo["loopback-rendezvous"] = found
    return found


def _loopback(facts: ModuleFacts, node: ast.AST) -> bool:
    if isinstance(node, (ast.Constant, ast.JoinedStr)):
        return _LOOPBACK_URL.match(_prefix(node)) is not None
    return isinstance(node, ast.Assign) and _loopback_master(facts, node)


def _branches(node: ast.If | ast.IfExp) -> list[ast.AST]:
    if isinstance(node, ast.IfExp):
        return [node.body, node.orelse]
    return [*node.body, *node.orelse]


def _prefix(node: ast.Constant | ast.JoinedStr) -> str:
    """A string literal, or an f-string's leading literal text (``f"tcp://localhost:{port}"``)."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else ""
    first = node.values[0] if node.values else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return ""


def _loopback_master(facts: ModuleFacts, node: ast.Assign) -> bool:
    """``os.environ["MASTER_ADDR"] = "localhost"``."""
    value = node.value
    if not (isinstance(value, ast.Constant) and value.value in _LOOPBACK_HOST):
        return False
    for target in node.targets:
        if (
            isinstance(target, ast.Subscript)
            and facts.imports.resolve(dotted(target.value)) == "os.environ"
            and isinstance(target.slice, ast.Constant)
            and target.slice.value == "MASTER_ADDR"
        ):
            return True
    return False
