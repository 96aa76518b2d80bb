"""The keywords a call hands on through ``**name``, when the function builds that dict in sight.

PyTorch's MNIST example, and the many scripts grown from it, build a loader's arguments as
dicts: ``train_kwargs = {"batch_size": 64}``, ``cuda_kwargs = {"num_workers": 1, "shuffle":
True}``, ``train_kwargs.update(cuda_kwargs)``, then ``DataLoader(dataset, **train_kwargs)``.
What the loader gets (a ``sampler``, ``shuffle=True``) is in those dicts. This reads them: a
name bound once in the function (or the module) to a dict literal or ``dict(key=value)``, with
the ``name.update(other)`` calls and ``name["key"] = value`` assignments of the same function,
``other`` read the same way. Anything else (a dict from a parameter, a function, a
comprehension, ``update`` with something unread) and the keywords are unknown: None.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("kw = {'batch_size': 64}\\n"
    ...        "cuda = {'shuffle': True}\\n"
    ...        "kw.update(cuda)\\n"
    ...        "dl = DataLoader(ds, **kw)\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> sorted(splatted_keywords(facts, facts.tree.body[3].value, facts.module_scope))
    ['batch_size', 'shuffle']
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted

__all__ = ["splatted_keywords"]

_MAX_DEPTH = 3


def splatted_keywords(
    facts: ModuleFacts, call: ast.Call, scope: Scope
) -> dict[str, ast.expr] | None:
    """The keywords every ``**name`` of the call hands on (``{}`` without any), or None when
    one of them is not a dict the function visibly builds."""
    found: dict[str, ast.expr] = {}
    for keyword in call.keywords:
        if keyword.arg is not None:
            continue
        keys = _dict_keys(facts, keyword.value, scope, 0)
        if keys is None:
            return None
        found.update(keys)
    return found


def _dict_keys(
    facts: ModuleFacts, expr: ast.expr, scope: Scope, depth: int
) -> dict[str, ast.expr] | None:
    if depth > _MAX_DEPTH:
        return None
    literal = _literal_keys(expr)
    if literal is not None:
        return literal
    if not isinstance(expr, ast.Name):
        return None
    values = facts.lookup_all(expr.id, scope)
    if len(values) != 1 or values[0] is None:
        return None
    keys = _literal_keys(values[0])
    if keys is None:
        return None
    for node in facts.scope_nodes.get(facts.scope_containing(expr).node, []):
        if isinstance(node, ast.Call) and _updates(node, expr.id):
            if len(node.args) != 1 or node.keywords:
                return None
            more = _dict_keys(facts, node.args[0], scope, depth + 1)
            if more is None:
                return None
            keys.update(more)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and dotted(target.value) == expr.id:
                    if not (
                        isinstance(target.slice, ast.Constant)
                        and isinstance(target.slice.value, str)
                    ):
                        return None
                    keys[target.slice.value] = node.value
    return keys


def _updates(call: ast.Call, name: str) -> bool:
    """``name.update(...)``."""
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr == "update" and dotted(func.value) == name


def _literal_keys(value: ast.expr) -> dict[str, ast.expr] | None:
    """The keys of a dict literal with string keys, or of ``dict(key=value)``."""
    if isinstance(value, ast.Dict):
        keys: dict[str, ast.expr] = {}
        for key, item in zip(value.keys, value.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                return None  # `**other` inside the literal, or a computed key
            keys[key.value] = item
        return keys
    if isinstance(value, ast.Call) and dotted(value.func) == "dict" and not value.args:
        if any(k.arg is None for k in value.keywords):
            return None
        return {k.arg: k.value for k in value.keywords if k.arg is not None}
    return None
