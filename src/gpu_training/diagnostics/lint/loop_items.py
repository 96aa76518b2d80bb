"""What a ``for`` loop's variable holds: an element of the iterable (``GT007``).

``my_indices = list(range(rank, n, world_size))`` is this rank's share of the samples; in
``for count, idx in enumerate(my_indices):`` the name ``idx`` is one of them, so a path built
from it (``out / f"{idx:06d}" / "latents.pt"``) is written by one rank only. The loop counter
``count`` is not: every rank counts from 0.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("for i, idx in enumerate(mine):\\n    pass\\n")
    >>> facts = ModuleFacts(tree)
    >>> [ast.unparse(e) for e in loop_sources(facts, "idx", facts.module_scope)]
    ['mine']
    >>> loop_sources(facts, "i", facts.module_scope)
    []
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import Imports, ModuleFacts, Scope, call_name

__all__ = ["loop_sources"]

_PAIRS = ("enumerate", "zip")  # their elements are tuples: the loop variable is no item


def _element_of(
    target: ast.expr, iterable: ast.expr, name: str, imports: Imports
) -> ast.expr | None:
    """The iterable whose elements ``name`` takes in ``for target in iterable``, or None."""
    if isinstance(target, ast.Name):
        wrapped = isinstance(iterable, ast.Call) and call_name(iterable, imports) in _PAIRS
        plain = not wrapped
        return iterable if target.id == name and plain else None
    if not isinstance(target, (ast.Tuple, ast.List)):
        return None
    callee = call_name(iterable, imports) if isinstance(iterable, ast.Call) else ""
    for position, element in enumerate(target.elts):
        if callee == "enumerate" and isinstance(iterable, ast.Call) and iterable.args:
            if position == 1:
                return _element_of(element, iterable.args[0], name, imports)
            continue  # the counter: the same on every rank
        if callee == "zip" and isinstance(iterable, ast.Call) and position < len(iterable.args):
            found = _element_of(element, iterable.args[position], name, imports)
            if found is not None:
                return found
    return None


def loop_sources(facts: ModuleFacts, name: str, scope: Scope) -> list[ast.expr]:
    """The iterables of the loops of ``scope`` whose elements ``name`` is bound to."""
    found: list[ast.expr] = []
    for node in facts.scope_nodes.get(scope.node, []):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            source = _element_of(node.target, node.iter, name, facts.imports)
            if source is not None:
                found.append(source)
    return found
