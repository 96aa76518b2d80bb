"""A name or attribute that nothing in the module reads (``GT002``).

``self.device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")`` places
nothing on ``cuda:0`` when no line reads ``self.device``: the modules and batches go wherever
the rest of the code sends them. A fixed device that is built and dropped is not every rank's
GPU choice, so ``GT002``'s literal ``cuda:N`` check skips it (the bare ``.cuda()`` calls of
the same file are judged on their own). The same holds for a local device handed only to
parameters of the file's functions that their bodies never read (:func:`places_nothing`).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> facts = ModuleFacts(ast.parse("self.device = d\\nx = 1\\nprint(x)\\n"))
    >>> never_read(facts, "self.device"), never_read(facts, "x")
    (True, False)
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import parameter_index, parents
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted

__all__ = ["never_read", "places_nothing"]


def never_read(facts: ModuleFacts, key: str) -> bool:
    """No node of the module loads ``key`` (``"device"``, ``"self.device"``); a ``getattr``
    or anything dynamic is not looked for."""
    return not any(
        isinstance(node, (ast.Name, ast.Attribute))
        and isinstance(node.ctx, ast.Load)
        and dotted(node) == key
        for node in facts.nodes
    )


def places_nothing(facts: ModuleFacts, key: str, scope: Scope) -> bool:
    """:func:`never_read`, or a local name of ``scope`` every read of which is an argument
    to a parameter of the file's own functions that their bodies never read
    (``test(model, device, loader, rank)`` where ``test`` sends everything ``.to(rank)``).

    Example:
        >>> src = ("def test(m, device):\\n    return m\\n"
        ...        "def main(m):\\n    device = 'cuda'\\n    test(m, device)\\n")
        >>> facts = ModuleFacts(ast.parse(src))
        >>> places_nothing(facts, "device", facts.scope_of(facts.tree.body[1]))
        True
    """
    if never_read(facts, key):
        return True
    if "." in key or key not in scope.bindings:
        return False
    held = parents(facts)
    reads = [
        n
        for n in facts.scope_nodes.get(scope.node, [])
        if isinstance(n, ast.Name) and n.id == key and isinstance(n.ctx, ast.Load)
    ]
    return bool(reads) and all(_unread_parameter(facts, held, n) for n in reads)


def _unread_parameter(facts: ModuleFacts, held: dict[int, ast.AST], read: ast.Name) -> bool:
    """``read`` is an argument of a call of the file's functions, each of which never reads
    the parameter it binds."""
    parent = held.get(id(read))
    keyword = parent.arg if isinstance(parent, ast.keyword) else None
    call = held.get(id(parent)) if isinstance(parent, ast.keyword) else parent
    if not isinstance(call, ast.Call) or (keyword is None and read not in call.args):
        return False
    funcs = facts.local_functions(call)
    if not funcs:
        return False
    for func in funcs:
        params = [a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]]
        name = keyword
        if name is None:
            position = call.args.index(read)
            name = next((p for p in params if parameter_index(func, p) == position), None)
        if name is None or name not in params:
            return False  # into *args or **kwargs: not followed
        if any(
            isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
            for n in ast.walk(func)
        ):
            return False
    return True
