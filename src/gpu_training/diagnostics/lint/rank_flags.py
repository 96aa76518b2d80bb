"""True/False flags that say "this process writes", switched by a rank test elsewhere.

Scripts often decide once who saves and test a flag later::

    save_models = True
    if dist.get_rank() != args.main_gpu:   # every rank but one
        save_models = False
    ...
    if save_models:
        torch.save(...)                     # one rank writes

The flag is True on one rank only, so ``if save_models:`` is a rank-0 guard as much as
``if rank == 0:`` (the same holds for ``save = False`` then ``save = True`` under a rank-0
test). The walk records, for each True/False assignment, which ranks ran it
(``ModuleFacts.assigned_under``); :func:`switched_off_elsewhere` reads that record.
(``rank != value``, every rank but one, is :mod:`~gpu_training.diagnostics.lint.all_but_one`.)
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted
from gpu_training.diagnostics.lint.node_flags import switch_functions

__all__ = ["switched_off_elsewhere"]


def switched_off_elsewhere(
    facts: ModuleFacts, key: str, scope: Scope, every: list[ast.expr | None]
) -> bool:
    """Whether a True/False name is True on rank 0 (or one rank) only.

    Args:
        facts: The module's facts (with the walk's record of the assignments).
        key: The name (``save_models``, ``self.save``).
        scope: Where it is read.
        every: Every value bound to it.

    Returns:
        True for ``x = True`` everywhere and ``x = False`` only on the other ranks, or
        ``x = False`` everywhere and ``x = True`` only on rank 0.
    """
    if not every or not all(
        isinstance(v, ast.Constant) and isinstance(v.value, bool) for v in every
    ):
        return False
    under = facts.assigned_under.get((facts.binding_owner(key, scope), key), set())
    tags = {t for t in under if isinstance(t, str)}
    if tags not in ({"True:all", "False:others"}, {"False:all", "True:rank0"}):
        return False
    functions = switch_functions(facts, key, scope, every)  # `__init__` for `self.flag`
    return all(_switch_covers_groups(facts, key, func) for func in functions)


def _switch_covers_groups(facts: ModuleFacts, key: str, func: ast.AST) -> bool:
    """The switch holds wherever a process group exists: the non-rank tests around the
    switching assignment also hold around every group creation of the module (a flag switched
    under ``if args.distributed:`` says nothing of a group made under ``elif args.ddp:``, or
    by a caller in the file before it calls the function)."""
    switches: list[frozenset[int]] = []
    groups: list[frozenset[int]] = []

    def visit(stmts: list[ast.stmt], tests: frozenset[int]) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            targets = stmt.targets if isinstance(stmt, ast.Assign) else []
            if isinstance(getattr(stmt, "value", None), ast.Constant) and any(
                dotted(t) == key for t in targets
            ):
                switches.append(tests)
            if isinstance(stmt, ast.If):
                inner = tests if facts.mentions_rank(stmt.test) else tests | {id(stmt)}
                visit(stmt.body, inner)
                visit(stmt.orelse, inner)
                continue
            blocks = [getattr(stmt, f, []) for f in ("body", "orelse", "finalbody")]
            blocks += [h.body for h in getattr(stmt, "handlers", [])]
            if any(blocks):
                heads = [n for f in ("iter", "items", "test") for n in [getattr(stmt, f, None)]]
                for head in heads:
                    if isinstance(head, list):
                        head = ast.Tuple(elts=[i.context_expr for i in head])
                    if isinstance(head, ast.AST) and _makes_group(facts, head):
                        groups.append(tests)
                for block in blocks:
                    visit(block, tests)
            elif _makes_group(facts, stmt):
                groups.append(tests)

    visit(getattr(func, "body", []), frozenset())
    callers = {id(where.node): where.node for _, where in facts.calls_of(func)}
    for caller in callers.values():  # a group its callers made before calling it: every path
        made = [
            c
            for c in facts.scope_nodes.get(caller, [])
            if isinstance(c, ast.Call) and not facts.local_functions(c) and _creates_group(facts, c)
        ]
        groups += [frozenset()] * len(made[:1])
    # a switch made on a path covers the groups made on that path (or an inner one)
    return (
        bool(switches)
        and all(sw <= g for sw in switches if sw for g in groups)
        and (bool(groups) or not any(switches))
    )


def _makes_group(facts: ModuleFacts, node: ast.AST) -> bool:
    return any(isinstance(c, ast.Call) and _creates_group(facts, c) for c in ast.walk(node))


def _creates_group(facts: ModuleFacts, call: ast.Call) -> bool:
    """``init_process_group(...)`` or a project function that makes one."""
    name = dotted(call.func) or ""
    if name.rsplit(".", 1)[-1] in ("init_process_group", "init_distributed"):
        return True
    return any(s.creates_group for s in facts.summaries(call))
