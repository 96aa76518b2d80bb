"""``GT009``: the collectives found under a rank guard, and which of them meet across ranks.

``if rank != 0: dist.barrier()`` ... ``if rank == 0: dist.barrier()`` is the classic "rank 0
goes first" idiom: the two barriers meet, and neither is reported.

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

__all__ = ["GuardedCollective", "unpaired_collectives"]


class GuardedCollective(NamedTuple):
    """A collective that runs under a rank guard of its own function (``GT009`` candidate)."""

    call: ast.Call
    collective: str
    """Its name as reported by :meth:`RankAnalysis.collective`."""
    side: str
    """Which ranks reach it: ``"rank0"``, ``"others"`` (every rank but 0) or ``"some"``."""
    where: ast.AST
    """The scope (function or module) it is in."""


def unpaired_collectives(guarded: list[GuardedCollective]) -> list[GuardedCollective]:
    """``GT009``: the guarded collectives, except those that rank 0 and the others both reach.

    ``if rank != 0: dist.barrier()`` ... ``if rank == 0: dist.barrier()`` is the classic
    "rank 0 goes first" idiom (download, preprocess, then release the others): the two
    barriers meet. Same function, same collective, as many calls on each side: paired.

    Args:
        guarded: Every collective found under a rank guard, in walk order.

    Returns:
        The ones to report.
    """
    sides: dict[tuple[int, str], dict[str, int]] = {}
    for _, collective, side, where in guarded:
        key = (id(where), collective.split("(")[0])
        sides.setdefault(key, {"rank0": 0, "others": 0, "some": 0})[side] += 1
    unpaired: list[GuardedCollective] = []
    for entry in guarded:
        count = sides[(id(entry.where), entry.collective.split("(")[0])]
        if entry.side != "some" and count["rank0"] == count["others"]:
            continue
        unpaired.append(entry)
    return unpaired
