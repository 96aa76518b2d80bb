"""A wrapped model that only runs inference: ``GT001`` has no gradients to reduce there.

``torch.nn.DataParallel`` is a training pitfall (one process, one thread per GPU, a
gradient scatter/gather every step). A file that also trains may still wrap a model for a
feature-extraction function: ``net = nn.DataParallel(net)`` to load a checkpoint saved with
``module.`` keys, then ``net.eval()`` and ``net(x)`` under ``torch.no_grad()``. The wrapper
is followed from the name it is bound to in its function: every use must be a call of it
under ``torch.no_grad()`` / ``inference_mode()`` or a method that moves, loads or switches
it to evaluation (``to``, ``cuda``, ``load_state_dict``, ``eval``...), with at least one
such call. A use that may train (``.train()``, ``.parameters()`` for an optimizer, the
model handed on or returned, a call outside ``no_grad``) keeps the finding.

A wrapper that is never run at all is not reported either: a script that wraps a model only
to load a checkpoint saved with ``module.`` keys and then calls ``net.module.record_grad(x)``
(or takes ``net.state_dict()``) goes round DataParallel; nothing is scattered to a GPU.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("def feats(net, x):\\n    net = nn.DataParallel(net)\\n    net.eval()\\n"
    ...        "    with torch.no_grad():\\n        return net(x).cpu()\\n")
    >>> tree = ast.parse(src)
    >>> facts = ModuleFacts(tree)
    >>> func = tree.body[0]
    >>> infers_only(facts, func.body[0].value, facts.scope_of(func))
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import node_end, node_start, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name

__all__ = ["infers_only"]

_HARMLESS = frozenset(
    {"eval", "to", "cuda", "cpu", "half", "float", "load_state_dict", "requires_grad_"}
)
_NO_GRAD = frozenset({"no_grad", "inference_mode"})
_AROUND = frozenset({"module", "state_dict"})  # the wrapped model itself: DataParallel never runs


def infers_only(facts: ModuleFacts, wrapped: ast.Call, scope: Scope) -> bool:
    """Whether a wrapper bound to a local name is only ever run under ``no_grad``.

    Args:
        facts: The module's facts.
        wrapped: The ``DataParallel(...)`` call.
        scope: The function it is in (the module scope is not followed: other files import it).

    Returns:
        True when every use of the name is an inference call, a harmless method or a way
        round the wrapper (``net.module``, ``net.state_dict()``), with at least one use, and
        no call of it is outside ``no_grad`` (see the module docstring); False otherwise.
    """
    if isinstance(scope.node, ast.Module):
        return False
    nodes = facts.scope_nodes.get(scope.node, [])
    bound = next(
        (
            n
            for n in nodes
            if isinstance(n, ast.Assign)
            and n.value is wrapped
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
        ),
        None,
    )
    target = bound.targets[0] if bound is not None else None
    if bound is None or not isinstance(target, ast.Name):
        return False
    name, after = target.id, node_end(bound)  # `net = DataParallel(net)` reads it first
    uses = [
        n
        for n in ast.walk(scope.node)
        if isinstance(n, ast.Name) and n.id == name
        if node_start(n) > after
    ]
    own = {id(n) for n in nodes}
    if any(id(n) not in own or not isinstance(n.ctx, ast.Load) for n in uses):
        return False  # a nested function uses it, or the name is rebound: not followed
    parents = {id(child): node for node in nodes for child in ast.iter_child_nodes(node)}
    for node in uses:
        user = parents.get(id(node))
        if isinstance(user, ast.Attribute) and user.attr in _HARMLESS | _AROUND:
            continue
        if not (
            isinstance(user, ast.Call) and user.func is node and _no_grad(facts, user, parents)
        ):
            return False  # trained, handed on, returned: it may reach a backward
    return bool(uses)


def _no_grad(facts: ModuleFacts, node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether ``node`` sits in a ``with torch.no_grad():`` (or ``inference_mode()``)."""
    parent = parents.get(id(node))
    while parent is not None:
        if isinstance(parent, (ast.With, ast.AsyncWith)) and any(
            isinstance(item.context_expr, ast.Call)
            and tail(call_name(item.context_expr, facts.imports)) in _NO_GRAD
            for item in parent.items
        ):
            return True
        parent = parents.get(id(parent))
    return False
