"""Paths stamped with a fine-grained clock: one per process, not shared (``GT017``).

``log_dir = "logs/" + str(datetime.now())`` names a directory after the microsecond the
process read the clock: two nodes' writers get two directories, so a write under a
node-local guard there is one file per node, not one shared path. A stamp rounded to the
second (``round(time.time())``, ``int(time.time())``, ``strftime("%Y%m%d-%H%M%S")``) is the
same on nodes started together, and stays shared.

The path is followed through the names it is built from and, for a parameter, through the
values every caller in the project passes (``Tee(log_dir if is_local_main_process else
None)``).
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import call_arg, parameter_index, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name

__all__ = ["process_stamped"]

_CLOCKS = frozenset({"datetime.now", "datetime.datetime.now", "time.time", "time.time_ns"})
_COARSE = frozenset({"round", "int", "strftime", "floor"})
_MAX_DEPTH = 4


def process_stamped(facts: ModuleFacts, call: ast.Call, scope: Scope, depth: int = 0) -> bool:
    """Whether an argument of a writing call holds a fine clock stamp (see the module)."""
    return any(_stamped(facts, arg, scope, depth) for arg in call.args)


def _stamped(facts: ModuleFacts, expr: ast.AST, scope: Scope, depth: int) -> bool:
    if depth > _MAX_DEPTH:
        return False
    coarse: set[int] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and _callee_tail(facts, node) in _COARSE:
            coarse.update(id(sub) for sub in ast.walk(node))
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and id(node) not in coarse:
            if call_name(node, facts.imports) in _CLOCKS:
                return True
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            values = facts.lookup_all(node.id, scope)
            if any(v is not None and _stamped(facts, v, scope, depth + 1) for v in values):
                return True
            if values == [None] and _passed_stamp(facts, node.id, scope, depth):
                return True
    return False


def _passed_stamp(facts: ModuleFacts, name: str, scope: Scope, depth: int) -> bool:
    """Every call of the function passes parameter ``name`` a stamped value (or None)."""
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    sites = [(facts, c, where) for c, where in facts.calls_of(func)]
    if facts.resolver is not None:
        sites += facts.resolver.incoming((facts, func))
    index = parameter_index(func, name)
    passed = [(owner, call_arg(c, index, name), where) for owner, c, where in sites]
    return bool(passed) and all(
        value is not None and _stamped(owner, value, where, depth + 1)
        for owner, value, where in passed
    )


def _callee_tail(facts: ModuleFacts, call: ast.Call) -> str:
    """The called name's last part (``strftime`` of ``datetime.now().strftime(...)`` too)."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return tail(call_name(call, facts.imports))
