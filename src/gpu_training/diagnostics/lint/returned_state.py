"""The DDP wrapper's ``state_dict()`` handed back by a function whose callers save it
(``GT006``).

A training function often ends with ``return {"model": model.state_dict(), "config": ...}``
and leaves the writing to its caller: ``states = train(args)`` ... ``save_checkpoint(states)``
in the entry script, another module. When ``model`` is the DDP wrapper there, every key of the
saved checkpoint carries the ``module.`` prefix, as if the function had saved it itself. The
function's callers (in its own file and in the project's other linted files) must hand what it
returns - directly, or through the names they bind it to (``states, metric = train(args)``) - to
a call that saves (``torch.save``, a ``save_checkpoint`` method of any object).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("def fit(m):\\n    return {'model': m.state_dict()}\\n"
    ...        "out = fit(net)\\ntorch.save(out, 'ckpt.pt')\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> call = facts.tree.body[0].body[0].value.values[0]
    >>> returned_and_saved(facts, call, facts.scope_of(facts.tree.body[0]))
    'fit() returns it and torch.save (line 4) writes it'
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted

__all__ = ["returned_and_saved"]


def returned_and_saved(facts: ModuleFacts, call: ast.Call, scope: Scope) -> str | None:
    """Where the value of ``call`` (a ``state_dict()`` call) is returned by its function and
    written by a caller of it: the evidence, or None."""
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    returned = any(
        isinstance(node, ast.Return) and node.value is not None and _holds_value(node.value, call)
        for node in facts.scope_nodes.get(func, [])
    )
    if not returned:
        return None
    sites = [(facts, site, where) for site, where in facts.calls_of(func)]
    if facts.resolver is not None:
        sites += facts.resolver.incoming((facts, func))
    for owner, site, where in sites:
        save = _saved_by_caller(owner, site, where)
        if save is not None:
            writer = call_name(save, owner.imports) or ast.unparse(save.func)
            return f"{func.name}() returns it and {writer} (line {save.lineno}) writes it"
    return None


def _holds_value(expr: ast.expr, call: ast.Call) -> bool:
    """``call`` is the returned value or an item of it (a dict's value, a tuple's element)."""
    if expr is call:
        return True
    if isinstance(expr, ast.Dict):
        return any(v is not None and _holds_value(v, call) for v in expr.values)
    if isinstance(expr, (ast.Tuple, ast.List)):
        return any(_holds_value(e, call) for e in expr.elts)
    return False


def _saved_by_caller(facts: ModuleFacts, site: ast.Call, where: Scope) -> ast.Call | None:
    """The saving call a call site's result reaches: as an argument, or through the names
    an assignment of the scope binds it to."""
    names: set[str] = set()
    nodes = facts.scope_nodes.get(where.node, [])
    for node in nodes:
        if isinstance(node, ast.Assign) and node.value is site:
            for target in node.targets:
                elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
                names.update(k for k in map(dotted, elts) if k is not None)
    for node in nodes:
        if not isinstance(node, ast.Call) or not _saves(facts, node):
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            if arg is site or dotted(arg) in names:
                return node
    return None


def _saves(facts: ModuleFacts, call: ast.Call) -> bool:
    """A call that writes what it is given: ``torch.save``, ``save_file``, any ``save*`` or
    ``*checkpoint`` method (``agent.save_checkpoint(states)``)."""
    func = call.func
    last = (
        func.attr if isinstance(func, ast.Attribute) else tail(call_name(call, facts.imports))
    ).lower()
    return last.startswith("save") or last.endswith("checkpoint")


def unpacked_from_local_call(
    facts: ModuleFacts, name: str, scope: Scope
) -> list[tuple[ast.expr, Scope]]:
    """What the function a name is unpacked from returns at the name's position, for each
    ``model, optimizer = create_model()`` of the scope that binds ``name`` (``create_model``
    a function of this module): ``(returned item, the function's scope)``."""
    found: list[tuple[ast.expr, Scope]] = []
    for node in facts.scope_nodes.get(scope.node, []):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        for target in node.targets:
            if not isinstance(target, (ast.Tuple, ast.List)):
                continue
            index = next(
                (i for i, e in enumerate(target.elts) if isinstance(e, ast.Name) and e.id == name),
                None,
            )
            if index is None:
                continue
            for func in facts.local_functions(node.value):
                inner = facts.scopes.get(func)
                for ret in facts.scope_nodes.get(func, []):
                    value = ret.value if isinstance(ret, ast.Return) else None
                    if (
                        inner is not None
                        and isinstance(value, ast.Tuple)
                        and index < len(value.elts)
                    ):
                        found.append((value.elts[index], inner))
    return found
