"""Branches of a helper that only some of its callers take, decided by the arguments they pass.

A helper called from two places starts in the merged context of both: one call under
``if rank == 0:``, one on every rank, makes its body run on every rank. But a test of the
helper's own parameters splits them: ``save_checkpoint(..., save_cur=True)`` on every rank
takes the ``if save_cur:`` branch, and the periodic ``save_checkpoint(...)`` under a rank-0
guard (``save_cur`` left at its default, False) takes the ``else``. The ``else`` then runs on
rank 0 only: the writes in it are guarded by where their only callers stand.

A branch is read per call site, with the literals each call binds to the parameters
(defaults included, :func:`~gpu_training.diagnostics.lint.collectives.bound_constants`); a
call whose arguments leave the test undecided reaches both branches. Only calls in the same
file are known by their arguments: a helper also called from another module is left to the
merged context. Dead branches (``if False:``) are not walked at all (:func:`live_branches`).

Example:
    >>> from gpu_training.diagnostics.lint import lint_source
    >>> src = '''
    ... import torch, torch.distributed as dist
    ... def save(state, last=False):
    ...     if last:
    ...         torch.save(state, "last.pt")
    ...     else:
    ...         torch.save(state, "periodic.pt")
    ... dist.init_process_group("nccl")
    ... if dist.get_rank() == 0:
    ...     save({})
    ... save({}, last=True)
    ... '''
    >>> [(f.code, f.line) for f in lint_source(src) if f.code == "GT007"]
    [('GT007', 5)]
"""

from __future__ import annotations

import ast
from dataclasses import replace
from typing import Protocol

from gpu_training.diagnostics.lint.collectives import UNDECIDED, bound_constants, literal
from gpu_training.diagnostics.lint.context import Ctx, entry_context
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope
from gpu_training.diagnostics.lint.never_called import never_runs

__all__ = ["branch_contexts", "live_branches", "note_site"]

_Func = ast.FunctionDef | ast.AsyncFunctionDef


class _Walker(Protocol):
    facts: ModuleFacts
    call_sites: dict[_Func, list[Ctx]]
    external_sites: dict[int, list[tuple[Ctx, bool]]]


def note_site(walker: _Walker, func: _Func, call: ast.Call, ctx: Ctx) -> None:
    """Record a call of a function of the same file: its context (for the function's entry
    context) and the call itself (for :func:`branch_contexts`). A call in a function that
    nothing calls (:func:`~gpu_training.diagnostics.lint.never_called.never_runs`) is marked
    ``dead``: it counts only for a function no live code calls."""
    if never_runs(walker.facts, walker.facts.scope_containing(call).node):
        ctx = replace(ctx, dead=True)
    walker.call_sites.setdefault(func, []).append(ctx)
    sites = walker.facts.memo.setdefault(("call-sites", id(func)), {})
    assert isinstance(sites, dict)
    sites[id(call)] = (call, ctx)  # the latest walk's context of each call


def branch_contexts(
    walker: _Walker, stmt: ast.If, scope: Scope, body: Ctx, orelse: Ctx
) -> tuple[Ctx, Ctx]:
    """The contexts of an ``if``'s body and ``else``: rank 0's where every caller that reaches
    the branch (by the arguments it passes) runs on rank 0 only, else as given.

    Args:
        walker: The file's checker (its call sites).
        stmt: An ``if`` of a function's body whose test is not a rank test.
        scope: The function's scope.
        body: The context the body is walked in otherwise.
        orelse: The context the ``else`` is walked in otherwise.
    """
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or body.rank0:
        return body, orelse
    names = {a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]}
    read = {n.id for n in ast.walk(stmt.test) if isinstance(n, ast.Name)}
    if not read or not read <= names or walker.external_sites.get(id(func)):
        return body, orelse  # a test of more than the parameters, or callers we cannot read
    sites = walker.facts.memo.get(("call-sites", id(func)))
    if not isinstance(sites, dict) or not sites:
        return body, orelse
    taking_body: list[Ctx] = []
    taking_else: list[Ctx] = []
    for call, site in sites.values():
        value = literal(stmt.test, bound_constants(func, call))
        if value is UNDECIDED or value:
            taking_body.append(site)
        if value is UNDECIDED or not value:
            taking_else.append(site)
    return _rank0_side(taking_body, body), _rank0_side(taking_else, orelse)


def _rank0_side(sites: list[Ctx], ctx: Ctx) -> Ctx:
    """The branch's context: rank 0's when every call reaching it runs on rank 0 only."""
    merged = entry_context(sites)
    if not sites or not merged.rank0:
        return ctx
    return replace(ctx, rank0=True, local_only=merged.local_only, guard=merged.guard)


_LIVE: dict[int, tuple[ast.If, ast.If]] = {}


def live_branches(stmt: ast.If) -> ast.If:
    """``stmt`` as it runs: a test the literals decide (``if False:``, ``if 0:``, ``if True:``)
    keeps only the branch it takes; the other one is dead code and is not walked."""
    value = literal(stmt.test, {})
    if value is UNDECIDED:
        return stmt
    cached = _LIVE.get(id(stmt))
    if cached is not None and cached[0] is stmt:
        return cached[1]
    dead: list[ast.stmt] = [ast.Pass(lineno=stmt.lineno, col_offset=stmt.col_offset)]
    live = ast.If(
        test=stmt.test,
        body=stmt.body if value else dead,
        orelse=[] if value else stmt.orelse,
        lineno=stmt.lineno,
        col_offset=stmt.col_offset,
        end_lineno=stmt.end_lineno,
        end_col_offset=stmt.end_col_offset,
    )
    _LIVE[id(stmt)] = (stmt, live)
    return live
