"""``GT009``: the collectives found under a rank guard, and which of them meet across ranks.

``if rank != 0: dist.barrier()`` ... ``if rank == 0: dist.barrier()`` is the classic "rank 0
goes first" idiom: the two barriers meet, and neither is reported. Written as a context
manager class, the two halves are its ``__enter__`` and ``__exit__``, which every ``with`` runs
both of: they pair as one function.

Example:
    >>> import ast
    >>> call = ast.parse("dist.barrier()", mode="eval").body
    >>> module = ast.Module([], [])
    >>> first = GuardedCollective(call, "barrier", "others", module)
    >>> second = GuardedCollective(call, "barrier", "rank0", module)
    >>> unpaired_collectives([first, second])
    []
    >>> [g.side for g in unpaired_collectives([second])]
    ['rank0']
"""

from __future__ import annotations

import ast
from typing import NamedTuple

__all__ = ["GuardedCollective", "pairing_scope", "unpaired_collectives"]

_CONTEXT_HALVES = frozenset({"__enter__", "__exit__", "__aenter__", "__aexit__"})


class GuardedCollective(NamedTuple):
    """A collective that runs under a rank guard of its own function (``GT009`` candidate)."""

    call: ast.Call
    collective: str
    """Its name as reported by :meth:`RankAnalysis.collective`."""
    side: str
    """Which ranks reach it: ``"rank0"``, ``"others"`` (every rank but 0) or ``"some"``."""
    where: ast.AST
    """Where its partner is looked for: its function or module (:func:`pairing_scope`)."""


def pairing_scope(node: ast.AST, cls: ast.ClassDef | None) -> ast.AST:
    """Where a guarded collective in ``node`` (a function or the module; ``cls``: the class
    of a method) looks for the collective that meets it: its own function, or, for a context
    manager's ``__enter__`` / ``__exit__``, their class (``if not self.first: barrier()`` on
    entry, ``if self.first: barrier()`` on exit: a ``with`` runs both halves).

    Example:
        >>> cls = ast.parse("class First:\\n def __enter__(self): pass\\n def f(self): pass").body[0]
        >>> [pairing_scope(method, cls) is cls for method in cls.body]
        [True, False]
    """
    if cls is not None and getattr(node, "name", None) in _CONTEXT_HALVES:
        return cls
    return node


def unpaired_collectives(guarded: list[GuardedCollective]) -> list[GuardedCollective]:
    """``GT009``: the guarded collectives, except those that rank 0 and the others both reach.

    ``if rank != 0: dist.barrier()`` ... ``if rank == 0: dist.barrier()`` is the classic
    "rank 0 goes first" idiom (download, preprocess, then release the others): the two
    barriers meet. Same function, same collective, as many calls on each side: paired. A
    collective a helper reaches counts as the one it reaches (``if rank == 0: serve();
    dist.broadcast(stop, 0)`` / ``else: model.follow()``, whose loop receives that broadcast).

    Args:
        guarded: Every collective found under a rank guard, in walk order.

    Returns:
        The ones to report.
    """
    sides: dict[tuple[int, str], dict[str, int]] = {}
    for _, collective, side, where in guarded:
        key = (id(where), _innermost(collective))
        sides.setdefault(key, {"rank0": 0, "others": 0, "some": 0})[side] += 1
    unpaired: list[GuardedCollective] = []
    for entry in guarded:
        count = sides[(id(entry.where), _innermost(entry.collective))]
        if entry.side != "some" and count["rank0"] == count["others"]:
            continue
        unpaired.append(entry)
    return unpaired


def _innermost(collective: str) -> str:
    """``"follow() (serve.py:9), which calls broadcast (serve.py:12)"`` -> ``"broadcast"``."""
    return collective.rsplit("which calls ", 1)[-1].split("(")[0].strip()
