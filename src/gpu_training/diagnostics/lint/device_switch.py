"""An ``if`` whose branches move the same thing to a rank's GPU and to a fixed one.

``if cfg.enable_fsdp: batch = batch.to(local_rank) else: batch = batch.to("cuda:0")``: the
branch with the fixed device is the one-process path of the script's own switch, however
the switch is spelled, even where no branch of the file creates the process group (an
evaluation helper called from a launcher elsewhere). :func:`one_process_side` names it, so
``GT002`` does not read its ``"cuda:0"`` as every rank's GPU.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("def f(x, ddp, local_rank):\\n    if ddp:\\n"
    ...                  "        x = x.to(local_rank)\\n    else:\\n        x = x.to('cuda:0')\\n")
    >>> facts = ModuleFacts(tree)
    >>> func = tree.body[0]
    >>> one_process_side(facts, func.body[0], facts.scope_of(func))
    'else'
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.guards import rank_derived
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["one_process_side"]

_MOVES = ("to", "cuda")


def one_process_side(
    facts: ModuleFacts, stmt: ast.If, scope: Scope, alone: bool = False
) -> str | None:
    """``"else"`` or ``"body"``: the branch of ``stmt`` that moves something to a fixed device
    (``"cuda:0"``, ``"cuda"``) while the other moves the same thing to a rank's device; None
    when the branches do not pair up so. Also ``"body"`` for the ``if __name__ ==
    "__main__":`` block of a module whose own code starts no group, no launcher and no
    framework (``alone``): run by itself it is one process, though the distributed scripts
    that import it make its functions run on every rank (an evaluation module's own test
    run of the helpers that the trainer calls on rank 0 only).

    Args:
        facts: The module's facts.
        stmt: The ``if`` statement.
        scope: The scope it is in.
        alone: Whether the module's own code sets up nothing distributed.
    """
    if alone and scope.node is facts.tree and _main_block(stmt):
        return "body"
    body, orelse = _moves(stmt.body), _moves(stmt.orelse)
    for target in body.keys() & orelse.keys():
        if rank_derived(facts, body[target], scope) and _fixed(orelse[target]):
            return "else"
        if rank_derived(facts, orelse[target], scope) and _fixed(body[target]):
            return "body"
    return None


def _main_block(stmt: ast.If) -> bool:
    """``if __name__ == "__main__":`` (either side)."""
    test = stmt.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and len(test.comparators) == 1):
        return False
    sides = {ast.unparse(test.left), ast.unparse(test.comparators[0])}
    return isinstance(test.ops[0], ast.Eq) and sides in (
        {"__name__", "'__main__'"},
        {"__name__", '"__main__"'},
    )


def _moves(stmts: list[ast.stmt]) -> dict[str, ast.expr]:
    """``{what moves: the device}`` for the branch's own ``x = x.to(d)`` / ``x.cuda(d)``."""
    found: dict[str, ast.expr] = {}
    for stmt in stmts:
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr)) else None
        if not (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in _MOVES
            and value.args
        ):
            continue
        moved = stmt.targets if isinstance(stmt, ast.Assign) else [value.func.value]
        found[" ".join(ast.dump(t, annotate_fields=False) for t in moved)] = value.args[0]
    return found


def _fixed(device: ast.expr) -> bool:
    """A literal CUDA device: the same GPU whichever rank runs it."""
    return (
        isinstance(device, ast.Constant)
        and isinstance(device.value, str)
        and device.value.split(":")[0] == "cuda"
    )
