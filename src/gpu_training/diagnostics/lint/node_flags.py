"""Flags switched on by a rank test in another method, and where that test's rank lives.

A class often decides once, in ``__init__``, who writes, and tests a flag in its methods::

    self.print = False
    if args.local_rank == 0:      # the index within the node
        self.print = True
    ...
    def save(self, path):
        if self.print:            # local rank 0 of every node: one writer per node
            torch.save(state, path)

* :func:`switch_functions` — the functions whose statements switch an attribute flag (the
  method that tests it need not be one of them);
* :func:`switch_locality` — the locality (``"local"``/``"global"``) of the rank tests under
  which a True/False flag is switched: a flag set under ``local_rank == 0`` is a node-local
  guard (``GT017`` for a shared path, never ``GT007``);
* :func:`value_scope` — where a value bound to an attribute flag is read: ``self.enabled =
  enabled`` reads ``__init__``'s parameter, which every caller may pass a rank test.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["switch_functions", "switch_locality", "value_scope"]

Locality = Callable[[ModuleFacts, ast.AST, Scope, int], "str | None"]


def value_scope(facts: ModuleFacts, key: str, scope: Scope) -> Callable[[ast.expr], Scope]:
    """Where a value bound to ``key`` is read: for ``self.flag`` the method that binds it
    (``self.enabled = enabled`` names ``__init__``'s parameter, whose callers pass the rank
    test: ``Logger(enabled=(local_rank == 0))``), for a plain name the reading scope."""
    if not key.startswith("self."):
        return lambda _value: scope
    return facts.scope_containing


def switch_functions(
    facts: ModuleFacts, key: str, scope: Scope, every: list[ast.expr | None]
) -> list[ast.AST]:
    """The functions whose assignments bind the flag: the reading scope's own function for
    a plain name, each assigning method for ``self.flag`` (``__init__`` mostly)."""
    if not key.startswith("self."):
        return [scope.node]
    found: dict[int, ast.AST] = {}
    for value in every:
        if value is not None:
            node = facts.scope_containing(value).node
            found.setdefault(id(node), node)
    return list(found.values()) or [scope.node]


def switch_locality(
    facts: ModuleFacts, values: list[ast.expr], depth: int, locality: Locality
) -> str | None:
    """The locality of the rank tests around a True/False flag's assignments.

    Args:
        facts: The module's facts.
        values: The values bound to the flag (all True/False constants, or None is returned).
        depth: The recursion depth of the caller.
        locality: :func:`~gpu_training.diagnostics.lint.locality.guard_locality`.

    Returns:
        ``"global"`` if any enclosing test reads a global rank, ``"local"`` if they read only
        node-local indices, None when no assignment sits under a rank test.
    """
    if not values or not all(
        isinstance(v, ast.Constant) and isinstance(v.value, bool) for v in values
    ):
        return None
    found: set[str] = set()
    for value in values:
        scope = facts.scope_containing(value)
        line = getattr(value, "lineno", 0)
        for node in facts.scope_nodes.get(scope.node, []):
            if not isinstance(node, ast.If) or not _in_branch(node, line):
                continue
            if not facts.mentions_rank(node.test):
                continue  # `if "best" in val_results:` reads data, not which process runs
            where = locality(facts, node.test, scope, depth + 1)
            if where is not None:
                found.add(where)
    if "global" in found:
        return "global"
    return "local" if found else None


def _in_branch(stmt: ast.If, line: int) -> bool:
    """Whether a line lies in the body or the else of an ``if`` (not its test)."""
    blocks = [b for b in (stmt.body, stmt.orelse) if b]
    return any(b[0].lineno <= line <= (b[-1].end_lineno or b[-1].lineno) for b in blocks)
