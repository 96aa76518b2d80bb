"""The flag that lets every rank past a rank-0 early return.

    use_fsdp_eval = args.fsdp and args.distributed
    if not use_fsdp_eval and not is_master(args):
        return metrics                       # the other ranks leave only without the flag
    ...
    if use_fsdp_eval:
        dist.broadcast(signal, src=0)        # every rank is here: the flag kept them all

After the early return the function runs on rank 0 alone *or* with the flag set, on every rank.
The walk records, with the context after the return, the rank-independent parts of its test
(``not use_fsdp_eval``) and the context before it; a later ``if`` whose branch makes one of those
parts fail (the body of ``if use_fsdp_eval:``) runs on the ranks that ran before the return, as
long as no name its test reads was assigned in between. Reading it as rank 0's reported the
broadcast as ``GT009`` (a collective only rank 0 reaches), though every rank calls it.

Example:
    >>> import ast
    >>> fails(ast.parse("not use_fsdp_eval", mode="eval").body)[1]
    True
"""

from __future__ import annotations

import ast
from dataclasses import replace

from gpu_training.diagnostics.lint.context import Ctx
from gpu_training.diagnostics.lint.guards import classify_guard
from gpu_training.diagnostics.lint.implied import known, unchanged
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["fails", "released_sides", "releasing"]


def fails(part: ast.expr) -> tuple[str, bool]:
    """The fact that makes ``part`` false: ``(ast.dump(x), True)`` for ``not x``."""
    negated = False
    while isinstance(part, ast.UnaryOp) and isinstance(part.op, ast.Not):
        part, negated = part.operand, not negated
    return ast.dump(part), negated


def releasing(facts: ModuleFacts, scope: Scope, stmt: ast.If, before: Ctx, after: Ctx) -> Ctx:
    """The context after ``if <rank test> and <flag test>: return``, remembering the flag.

    Args:
        facts: The module's facts.
        scope: The function the ``if`` is in.
        stmt: The rank-dependent ``if`` whose body returns.
        before: The context the ``if`` was reached in.
        after: The context of what follows it (the ranks that did not return).
    """
    test = stmt.test
    if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)):
        return after
    parts = frozenset(
        fails(part) for part in test.values if classify_guard(facts, part, scope) is None
    )
    if not parts:
        return after
    return replace(after, released=(*after.released, (parts, before, stmt.lineno)))


def released_sides(
    facts: ModuleFacts, scope: Scope, stmt: ast.If, body: Ctx, orelse: Ctx
) -> tuple[Ctx, Ctx]:
    """The contexts of a non-rank ``if``'s two branches, with the ranks of the context before a
    remembered early return where the branch makes one of its flag parts fail."""
    sides = []
    for ctx, holds in ((body, True), (orelse, False)):
        if not ctx.released:  # the common case: no early return to remember
            sides.append(ctx)
            continue
        settled = known(stmt.test, holds)
        for parts, before, line in ctx.released:
            if parts & settled and unchanged(facts, scope, stmt.test, line, stmt.lineno):
                ctx = _with_ranks(ctx, before)
                break
        sides.append(ctx)
    return sides[0], sides[1]


def _with_ranks(ctx: Ctx, before: Ctx) -> Ctx:
    """``ctx`` (its loops, its no_sync, what it tested) run on the ranks of ``before``."""
    return replace(
        ctx,
        rank0=before.rank0,
        others=before.others,
        rank_dep=before.rank_dep,
        local_only=before.local_only,
        one_rank=before.one_rank,
        all_but_one=before.all_but_one,
        guard=before.guard,
        guarded_here=before.guarded_here,
        excused=before.excused,
        released=before.released,
    )
