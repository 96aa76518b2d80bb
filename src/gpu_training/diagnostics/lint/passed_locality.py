"""Which rank a parameter holds, from what its callers pass (``GT017``).

``class Trainer: def __init__(self, model, rank): self.rank = rank`` says nothing about which
rank ``rank`` is; the script that builds it does: ``rank = int(os.environ["LOCAL_RANK"])``,
``Trainer(model, rank=rank)``. When every call of the function - in its own file or in another
linted file of the project - passes a node-local rank, the parameter is the node-local rank,
and a guard ``if self.rank < 1:`` holds on local rank 0 of every node.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("def save(rank):\\n    pass\\n"
    ...        "save(int(os.environ['LOCAL_RANK']))\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> from gpu_training.diagnostics.lint.locality import guard_locality
    >>> passed_locality(facts, "rank", facts.scope_of(facts.tree.body[0]), 0, guard_locality)
    'local'
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from gpu_training.diagnostics.lint.calls import call_arg, parameter_index
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

Locality = Callable[[ModuleFacts, ast.expr, Scope, int], "str | None"]
"""``guard_locality``'s signature: ``(facts, value, scope, depth) -> "local" | "global" | None``."""

__all__ = ["passed_locality"]


def passed_locality(
    facts: ModuleFacts, name: str, scope: Scope, depth: int, locality: Locality
) -> str | None:
    """``"local"``/``"global"`` when every call of ``scope``'s function passes parameter
    ``name`` a rank of that locality; None when a call passes nothing (the default), passes
    something else, or nobody calls it (kept in ``facts.memo``). ``locality``: how a passed
    value is classified (``locality.guard_locality``, which calls this function: passed in,
    not imported, so the two modules import no circle)."""
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or depth > 4:
        return None
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]]
    if name not in params:
        return None
    key = ("passed-locality", id(func), name)
    if key in facts.memo:
        return facts.memo[key]  # type: ignore[return-value]
    facts.memo[key] = None  # a parameter passed on to itself proves nothing
    sites = [(facts, call, where) for call, where in facts.calls_of(func)]
    if facts.resolver is not None:  # callers that run distributed (not a single-GPU script)
        resolver = facts.resolver
        sites += [s for s in resolver.incoming((facts, func)) if resolver.runs_distributed(s[0])]
    index = parameter_index(func, name)
    found: set[str | None] = set()
    for owner, call, where in sites:
        value = call_arg(call, index, name)
        found.add(None if value is None else locality(owner, value, where, depth + 1))
    result = found.pop() if len(found) == 1 else None
    facts.memo[key] = result
    return result
