"""Statements that certainly raise ``NameError``: nothing after them in their block runs.

A draft often reads a name it never defines: ``save_dir = f"step-{global_step}"`` where no
``global_step`` is bound anywhere in the module, ``model_engine.save_pretrained(save_dir)``
in a script whose engine is called ``model``. Such a statement raises ``NameError`` every time
it runs, so no later statement of its block ever runs in any process: a write there writes
nothing (``GT007``), a collective there joins nothing.

What counts: a name that is loaded where the statement certainly evaluates it (a call's
receiver and arguments, an assignment's value, an ``if``'s test, a ``for``'s iterable — not a
lambda's body, a nested ``def``, the branches of ``x if c else y`` or the right of ``and``/
``or``) and that the module binds nowhere, in any scope (no assignment, ``def``, ``class``,
import, parameter, loop or ``with`` target, ``except ... as``, ``global``), and that is no
builtin. Only a complete program is judged (:func:`complete_program`: it parses its own
command line and runs itself), not a snippet whose context binds its free names. A module
that can bind names unseen (``from x import *``, ``exec``, ``globals()``,
``builtins``/``__builtins__``, ``sys.modules``) is not judged. The dead span runs from the
statement to the end of its block (the rest of an ``if`` body, of a ``try`` body).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("import argparse, os\\ndef save(out):\\n    d = os.path.join(out, str(step))\\n"
    ...        "    os.makedirs(d)\\nif __name__ == '__main__':\\n"
    ...        "    save(argparse.ArgumentParser().parse_args().out)\\n")
    >>> raising_spans(ModuleFacts(ast.parse(src)))
    [(3, 4)]
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator

from gpu_training.diagnostics.lint.calls import has_main_block
from gpu_training.diagnostics.lint.model import ModuleFacts, dotted

__all__ = ["complete_program", "raising_spans", "unbound_names"]

_MODULE_NAMES = frozenset(
    {
        "__file__",
        "__name__",
        "__doc__",
        "__spec__",
        "__loader__",
        "__package__",
        "__path__",
        "__annotations__",
        "__cached__",
        "__builtins__",
        "__dict__",
    }
)
_INJECTED = frozenset({"get_ipython", "display", "In", "Out"})  # a notebook kept as a .py file
_UNSEEN_BINDERS = frozenset({"exec", "globals", "builtins", "__builtins__", "vars", "locals"})
_KNOWN = frozenset(dir(builtins)) | _MODULE_NAMES | _INJECTED
_Block = list[ast.stmt]


def unbound_names(facts: ModuleFacts) -> frozenset[str] | None:
    """The names the module loads and binds nowhere (no builtin); None when it may bind
    names unseen (a star import, ``exec``, ``globals()``, ``sys.modules``). Kept in memo."""
    key = "unbound-names"
    if key in facts.memo:
        cached = facts.memo[key]
        return cached if isinstance(cached, frozenset) else None
    bound: set[str] = set()
    loaded: set[str] = set()
    unseen = False
    for node in facts.nodes:
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            unseen = unseen or node.id in _UNSEEN_BINDERS
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            unseen = unseen or node.name == "*"
            bound.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
        elif isinstance(node, ast.Attribute) and node.attr == "modules":
            unseen = unseen or (isinstance(node.value, ast.Name) and node.value.id == "sys")
        elif type(node).__name__ in ("TypeVar", "ParamSpec", "TypeVarTuple"):
            bound.add(str(getattr(node, "name", "")))
    result = None if unseen else frozenset(loaded - bound - _KNOWN)
    facts.memo[key] = result
    return result


def raising_spans(facts: ModuleFacts) -> list[tuple[int, int]]:
    """The line spans that never run: from each statement that certainly reads an unbound
    name as a value (``global_step``, ``model_engine.save(...)``) to the end of its block (the
    first such statement of a block only). An unbound function called by name (``Net()``,
    ``build_loader(cfg)``) is left alone: a program written to show a pattern stands in for
    its model and data that way, and the draft's tell is a value it forgot to keep."""
    unbound = unbound_names(facts) if complete_program(facts) else None
    if not unbound:
        return []
    spans: list[tuple[int, int]] = []
    for block in _blocks(facts.tree.body):
        for stmt in block:
            if any(n.id in unbound for n in _evaluated_names(stmt)):
                end = block[-1].end_lineno or block[-1].lineno
                spans.append((stmt.lineno, end))
                break
    return spans


def complete_program(facts: ModuleFacts) -> bool:
    """The module runs as it stands: it builds its own command line (an ``ArgumentParser``)
    and runs itself under ``if __name__ == "__main__":``. A snippet (a guide's excerpt, a test
    case) reads names its context would bind (``model``, ``loader``); a program that parses
    its own arguments and runs has no such context."""
    return has_main_block(facts.tree) and any(
        isinstance(node, ast.Call)
        and (dotted(node.func) or "").rsplit(".", 1)[-1].endswith("ArgumentParser")
        for node in facts.nodes
    )


def _blocks(body: _Block) -> Iterator[_Block]:
    """Every statement list of the module: its body and the bodies nested in it."""
    yield body
    for stmt in body:
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                yield from _blocks(inner)
        for handler in getattr(stmt, "handlers", []):
            yield from _blocks(handler.body)
        for case in getattr(stmt, "cases", []):
            yield from _blocks(case.body)


def _evaluated_names(stmt: ast.stmt) -> Iterator[ast.Name]:
    """The names a statement loads every time it runs (its own expressions, not its
    nested blocks)."""
    roots: list[ast.expr | None]
    if isinstance(stmt, (ast.Expr, ast.Return, ast.AugAssign, ast.AnnAssign)):
        roots = [stmt.value]
    elif isinstance(stmt, ast.Assign):
        roots = [stmt.value, *[t for t in stmt.targets if not isinstance(t, ast.Name)]]
    elif isinstance(stmt, (ast.If, ast.While)):
        roots = [stmt.test]
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        roots = [stmt.iter]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        roots = [item.context_expr for item in stmt.items]
    elif isinstance(stmt, ast.Raise):
        roots = [stmt.exc]
    else:
        roots = []  # a def, a class, an assert (-O drops it), a try, a match, a del
    for root in roots:
        if root is not None:
            yield from _certain_loads(root)


def _certain_loads(expr: ast.expr) -> Iterator[ast.Name]:
    """The names an expression always loads when evaluated."""
    if isinstance(expr, ast.Name):
        if isinstance(expr.ctx, ast.Load):
            yield expr
        return
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
        for arg in [*expr.args, *(k.value for k in expr.keywords)]:  # not the callee: see
            yield from _certain_loads(arg)  # :func:`raising_spans`
        return
    if isinstance(expr, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        if not isinstance(expr, ast.Lambda):
            yield from _certain_loads(expr.generators[0].iter)  # evaluated at once
        return
    if isinstance(expr, ast.IfExp):
        yield from _certain_loads(expr.test)
        return
    if isinstance(expr, ast.BoolOp):
        yield from _certain_loads(expr.values[0])
        return
    for child in ast.iter_child_nodes(expr):
        if isinstance(child, ast.expr):
            yield from _certain_loads(child)
