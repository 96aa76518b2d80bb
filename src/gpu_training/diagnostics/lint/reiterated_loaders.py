"""``GT005``: a shuffling sampler's loader handed to a function that passes over it again and
again (``while True: for batch in loader: yield batch``) while ``set_epoch`` runs at most once.

An endless batch generator (or any helper with an outer loop around ``for batch in loader``)
is an epoch loop: each inner pass is a new epoch. A ``DistributedSampler`` reseeds only on
``set_epoch``; set once before (``sampler.set_epoch(0)``) or never, every pass draws the same
order. Reported at the call that hands the loader over, when the helper calls no
``set_epoch`` and no ``set_epoch`` of the file runs inside a loop.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("def forever(loader):\\n    while True:\\n        for b in loader:\\n"
    ...        "            yield b\\n"
    ...        "sampler = DistributedSampler(ds, shuffle=True)\\nsampler.set_epoch(0)\\n"
    ...        "loader = DataLoader(ds, sampler=sampler)\\nbatches = forever(loader)\\n")
    >>> [c.lineno for c in reiterated_loaders(ModuleFacts(ast.parse(src)))]
    [8]
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import keyword_arg, tail
from gpu_training.diagnostics.lint.epochs import shuffling_sampler
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted

__all__ = ["reiterated_loaders"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def reiterated_loaders(facts: ModuleFacts) -> list[ast.Call]:
    """The calls handing a shuffling sampler's loader to a function that re-iterates it.

    Args:
        facts: The file's facts.

    Returns:
        The calls to report.
    """
    if any(tail(dotted(c.func)) == "set_epoch" for c in _calls_in_loops(facts.tree)):
        return []
    found: list[ast.Call] = []
    for call in facts.calls:
        loaders = [a for a in call.args if isinstance(a, ast.Name) and _shuffled(facts, a)]
        if not loaders:
            continue
        for _, func in facts.callees(call):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = [a.arg for a in func.args.args]
            positions = [call.args.index(a) for a in loaders]
            names = {params[i] for i in positions if i < len(params)}
            if names and _reiterates(func, names):
                found.append(call)
                break
    return found


def _shuffled(facts: ModuleFacts, name: ast.Name) -> bool:
    """A name bound to ``DataLoader(..., sampler=s)`` with ``s`` a shuffling distributed
    sampler."""
    scope = facts.scope_containing(name)
    for value in facts.lookup_all(name.id, scope):
        if not isinstance(value, ast.Call) or tail(call_name(value, facts.imports)) != "DataLoader":
            continue
        sampler = keyword_arg(value, "sampler")
        if isinstance(sampler, ast.Call) and shuffling_sampler(sampler, facts.imports):
            return True
        if isinstance(sampler, ast.Name) and any(
            isinstance(v, ast.Call) and shuffling_sampler(v, facts.imports)
            for v in facts.lookup_all(sampler.id, scope)
        ):
            return True
    return False


def _reiterates(func: ast.FunctionDef | ast.AsyncFunctionDef, names: set[str]) -> bool:
    """The function loops around a ``for`` over one of ``names`` and calls no ``set_epoch``."""
    if any(isinstance(n, ast.Call) and tail(dotted(n.func)) == "set_epoch" for n in ast.walk(func)):
        return False
    for outer in ast.walk(func):
        if not isinstance(outer, _LOOPS):
            continue
        for inner in ast.walk(outer):
            if (
                inner is not outer
                and isinstance(inner, (ast.For, ast.AsyncFor))
                and isinstance(inner.iter, ast.Name)
                and inner.iter.id in names
            ):
                return True
    return False


def _calls_in_loops(tree: ast.AST) -> list[ast.Call]:
    return [
        n
        for loop in ast.walk(tree)
        if isinstance(loop, _LOOPS)
        for n in ast.walk(loop)
        if isinstance(n, ast.Call)
    ]
