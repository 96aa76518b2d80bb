"""A download between the two barriers of "rank 0 goes first" is made once (``GT007``).

The idiom::

    if dist.get_rank() != 0:
        dist.barrier()          # the others wait ...
    data = MNIST("./data", download=True)
    if dist.get_rank() == 0:
        dist.barrier()          # ... until rank 0 has the files

lets rank 0 download while every other rank waits at its barrier; when rank 0 reaches its own
barrier the two meet, and the others run the same line, find the files and download nothing.
A download made so is one writer (a random sample's reader: false, ``guarded``), as it is in
``torch_distributed_zero_first()``. Other writes are not: each rank still writes after the
barrier, only later (a ``torch.save`` there is every rank's write, and stays reported).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("import torch.distributed as dist\\n"
    ...        "if dist.get_rank() != 0:\\n    dist.barrier()\\n"
    ...        "data = MNIST('./data', download=True)\\n"
    ...        "if dist.get_rank() == 0:\\n    dist.barrier()\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> call = facts.tree.body[2].value
    >>> rank0_first(facts, call, facts.scope_of(facts.tree))
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import enclosing_blocks, tail
from gpu_training.diagnostics.lint.guards import GUARD_NOT_RANK0, GUARD_RANK0, classify_guard
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name

__all__ = ["rank0_first"]

_WAITS = frozenset({"barrier", "wait_for_everyone"})


def rank0_first(facts: ModuleFacts, call: ast.Call, scope: Scope) -> bool:
    """Whether ``call`` sits between ``if <not rank 0>: barrier()`` and a later
    ``if <rank 0>: barrier()`` of the same block (in ``scope``'s own body or a block inside it).

    Args:
        facts: The module's facts.
        call: The write.
        scope: The function (or module) it is in.

    Returns:
        True when the two barriers enclose it.
    """
    body = getattr(scope.node, "body", None)
    return isinstance(body, list) and any(
        any(_waits(facts, scope, s, GUARD_NOT_RANK0) for s in block[:i])
        and any(_waits(facts, scope, s, GUARD_RANK0) for s in block[i + 1 :])
        for block, i in enclosing_blocks(body, call)
    )


def _waits(facts: ModuleFacts, scope: Scope, stmt: ast.stmt, side: str) -> bool:
    """``if <test on side>: ... barrier()`` with no ``else``, or inside a test that is no
    rank test (``if args.distributed: if rank != 0: barrier()``)."""
    if not isinstance(stmt, ast.If) or stmt.orelse:
        return False
    kind = classify_guard(facts, stmt.test, scope)
    if kind == side:
        return any(
            isinstance(node, ast.Call) and tail(call_name(node, facts.imports)) in _WAITS
            for s in stmt.body
            for node in ast.walk(s)
        )
    return kind is None and any(_waits(facts, scope, s, side) for s in stmt.body)
