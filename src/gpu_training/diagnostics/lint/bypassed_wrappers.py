"""A backward whose forward ran on the module a DDP wrapper holds, not on the wrapper.

``DistributedDataParallel`` all-reduces the gradients of a backward only when the forward
went through the wrapper (its ``forward`` arms the reducer). A script that wraps ``policy``
(``model = DDP(policy, device_ids=[rank])``) but computes the loss with
``policy.compute_loss(batch)`` runs every micro-batch's backward with no all-reduce at all:
there is nothing for ``no_sync()`` to skip, so ``GT013`` (an all-reduce per micro-batch)
does not describe it (the gradients are never averaged: a different bug).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = '''
    ... def train(policy, batches, rank):
    ...     model = DDP(policy, device_ids=[rank])
    ...     for batch in batches:
    ...         loss, logs = policy.compute_loss(batch)
    ...         loss.backward()
    ... '''
    >>> facts = ModuleFacts(ast.parse(src))
    >>> call = [c for c in facts.calls if ast.unparse(c.func) == "loss.backward"][0]
    >>> func = facts.tree.body[0]
    >>> bypasses_wrapper(facts, call, facts.scope_of(func))
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted

__all__ = ["bypasses_wrapper", "trains_own_sharded_model"]

_WRAPPERS = ("DistributedDataParallel", "DDP")
_SHARDED = ("FullyShardedDataParallel", "FSDP", "fully_shard")


def _wrapper_tails(facts: ModuleFacts, node: ast.AST) -> set[str]:
    return {
        call_name(c, facts.imports).rsplit(".", 1)[-1]
        for c in ast.walk(node)
        if isinstance(c, ast.Call)
    } & {*_WRAPPERS, *_SHARDED}


def trains_own_sharded_model(facts: ModuleFacts, scope: Scope) -> bool:
    """Whether the function wraps the model it trains in FSDP itself (``FSDP(model)``,
    ``fully_shard(model)``, or a call of a function of the same module that does) and makes no
    DDP wrapper: its backward reduce-scatters by design, whatever DDP model an importing file
    trains with the module's other helpers (``GT013`` is about DDP's all-reduce)."""
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    own = _wrapper_tails(facts, func)
    local = {
        n.name: n
        for n in facts.tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not func
    }
    for call in (c for c in ast.walk(func) if isinstance(c, ast.Call)):
        if isinstance(call.func, ast.Name) and call.func.id in local:
            own |= _wrapper_tails(facts, local[call.func.id])
    return bool(own & set(_SHARDED)) and not own & set(_WRAPPERS)


def _root(expr: ast.expr) -> str | None:
    """The object a forward is called on: ``policy`` of ``policy.compute_loss(x)`` and of
    ``policy(x)``; ``self.policy`` of ``self.policy.loss(x)``."""
    func = expr.func if isinstance(expr, ast.Call) else None
    if func is None:
        return None
    if isinstance(func, ast.Attribute) and isinstance(func.value, (ast.Name, ast.Attribute)):
        return dotted(func.value)
    return dotted(func)


def _targets(node: ast.Assign | ast.AnnAssign) -> set[str]:
    names: set[str] = set()
    for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        for sub in ast.walk(target):
            key = dotted(sub) if isinstance(sub, (ast.Name, ast.Attribute)) else None
            if key is not None:
                names.add(key)
    return names


def bypasses_wrapper(facts: ModuleFacts, call: ast.Call, scope: Scope) -> bool:
    """Whether ``loss.backward()`` differentiates a loss computed on the module that a DDP
    wrapper of the same function holds, never on the wrapper.

    Args:
        facts: The module's facts.
        call: The ``.backward()`` call.
        scope: The function it is in.

    Returns:
        True when one of the loss's names was last bound (before the backward) to a value
        calling ``m`` (``m.compute_loss(x)``, ``criterion(m(x), y)``), ``DDP(m, ...)`` is made in the same function under another name, and none
        of them from a call on the wrapper.
    """
    if not isinstance(call.func, ast.Attribute):
        return False
    nodes = facts.scope_nodes.get(scope.node, [])
    assigns = [
        n for n in nodes if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None
    ]
    wrapped: dict[str, set[str]] = {}  # the module passed to DDP -> the names of the wrapper
    for node in assigns:
        value = node.value
        if not isinstance(value, ast.Call) or not value.args:
            continue
        if call_name(value, facts.imports).rsplit(".", 1)[-1] in _WRAPPERS:
            inner = dotted(value.args[0])
            if inner is not None:
                wrapped.setdefault(inner, set()).update(_targets(node))
    if not wrapped:
        return False
    line = call.lineno
    names = {dotted(n) for n in ast.walk(call.func.value) if isinstance(n, ast.Name)}
    roots: set[str | None] = set()
    for name in names - {None}:
        before = [n for n in assigns if name in _targets(n) and n.lineno < line]
        if before:
            last = max(before, key=lambda n: n.lineno).value
            roots |= (
                {_root(c) for c in ast.walk(last) if isinstance(c, ast.Call)} if last else set()
            )
    wrappers = set().union(*wrapped.values())
    return bool(roots & wrapped.keys()) and not roots & wrappers
