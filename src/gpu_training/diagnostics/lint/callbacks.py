"""Functions named but not called in an expression: callbacks that run where they are handed.

``signal.signal(SIGTERM, handler)``, ``functools.partial(on_term, out_dir=d)``,
``atexit.register(flush)``, ``mp.Process(target=work)``: the function runs later in the
process that registered it, so the registration's context is one of its call sites (a
handler installed on every rank writes on every rank; one installed under ``if rank == 0:``
on rank 0 only). A function of the same file or, through the project, of another module.
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.patched_methods import method_names, patched_names
from gpu_training.diagnostics.lint.summary import FuncRef

__all__ = ["referenced_functions"]


def referenced_functions(
    facts: ModuleFacts,
    subs: list[ast.AST],
    called: set[int],
    patched: dict[int, tuple[ast.AST, str]] | None = None,
) -> list[FuncRef]:
    """The project's functions an expression names without calling them.

    Args:
        facts: The module's facts (with its project, if any).
        subs: Every node of the expression.
        called: The ids of the expression's callee nodes (``f`` of ``f(x)``).
        patched: Filled with ``id(def) -> (def, method name)`` for each function of this
            file stored over a method (``trainer.save = save_more``: patched_methods.py),
            which runs where that method is called, not here (so it is left out).

    Returns:
        ``(module facts, def)`` for each name read that is a function of this file or a
        module-level function imported from another module of the project (a class named
        in ``isinstance(x, Ema)`` hands on no ``__init__``).
    """
    found: list[FuncRef] = []
    stores = any(isinstance(s, ast.Assign) for s in subs)
    over = patched_names(subs, method_names(facts)) if stores else {}
    for sub in subs:
        if not isinstance(sub, ast.Name) or not isinstance(sub.ctx, ast.Load):
            continue
        if id(sub) in called:
            continue
        local = facts.functions.get(sub.id, [])
        if local and id(sub) in over:
            if patched is not None:
                patched.update({id(func): (func, over[id(sub)]) for func in local})
            continue
        found += [(facts, func) for func in local]
        if not local and sub.id in facts.imports.origins and facts.resolver is not None:
            found += [
                ref
                for ref in facts.resolver.callees(facts, sub)
                if _module_level(ref)  # a function, not the class an import names
            ]
    return found


def _module_level(ref: FuncRef) -> bool:
    """``ref``'s function is a statement of its module's body (its ids kept in the module's
    ``memo``: asked for every imported name an expression reads)."""
    owner, func = ref
    ids = owner.memo.get("module-body-ids")
    if not isinstance(ids, frozenset):
        ids = owner.memo["module-body-ids"] = frozenset(id(s) for s in owner.tree.body)
    return id(func) in ids
