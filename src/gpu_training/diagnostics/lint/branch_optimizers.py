"""An optimizer made inside the rank-dependent branch that steps it (``GT014``).

``GT014`` says a step or an LR change under a rank guard makes the replicas diverge: the ranks
outside the branch keep the old weights. That assumes they hold a replica. In

    if rank % 2 == 0:
        model = DDP(ToyModel())
        optimizer = optim.SGD(model.parameters(), lr=0.001)
        ...
        optimizer.step()

the odd ranks build no model and no optimizer at all: there is no replica of theirs to
diverge from. (What is wrong there is the DDP constructor, a collective, on even ranks only:
``GT009`` reports it.) A step of an optimizer whose every binding in the function lies inside
the innermost rank-dependent ``if`` holding the step is not reported.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("import torch.distributed as dist\\n"
    ...        "def f(model):\\n"
    ...        "    if dist.get_rank() % 2 == 0:\\n"
    ...        "        opt = make(model)\\n"
    ...        "        opt.step()\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> func = facts.tree.body[1]
    >>> step = func.body[0].body[1].value
    >>> built_in_branch(facts, step, facts.scope_of(func))
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import node_end, node_start, parents
from gpu_training.diagnostics.lint.guards import (
    GUARD_NOT_RANK0,
    GUARD_RANK0,
    GUARD_RANK_DEP,
    classify_guard,
)
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["built_in_branch"]

_RANK_GUARDS = frozenset({GUARD_RANK0, GUARD_NOT_RANK0, GUARD_RANK_DEP})


def built_in_branch(facts: ModuleFacts, call: ast.Call, scope: Scope) -> bool:
    """Whether ``call`` (``opt.step()``) steps a local name bound only inside the innermost
    rank-dependent ``if`` body that holds the call.

    Args:
        facts: The file's facts.
        call: A method call on a plain name (``optimizer.step()``).
        scope: The function it is in.
    """
    if not (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)):
        return False
    entries = scope.bindings.get(call.func.value.id)
    if not entries or any(value is None for _, value in entries):
        return False  # a parameter or a loop variable: made elsewhere
    held = parents(facts)
    child: ast.AST = call
    node = held.get(id(call))
    while node is not None and node is not scope.node:
        if (
            isinstance(node, ast.If)
            and any(child is s for s in node.body)
            and classify_guard(facts, node.test, scope) in _RANK_GUARDS
        ):
            start, end = node_start(node.body[0]), node_end(node.body[-1])
            return all(start <= at <= end for at, _ in entries)
        child, node = node, held.get(id(node))
    return False
