"""Where ``lint``'s walks keep their answers.

A walk over names and calls (what a value is, whether a path is private to the process, how a
condition depends on the rank) asks the same questions again and again: a script that rebinds
one name thirty times asks about each binding once per path through the others, which is
exponential without kept answers. An answer is kept in the module's ``memo``, except while a
function of the project is being summarised: then the walk sees a summary still in progress
(a recursive call reads as doing nothing), and what it learns is kept only until that summary
is done (:func:`uncached`).

Example:
    >>> memo: dict[object, object] = {}
    >>> answers(memo) is memo
    True
    >>> with uncached():
    ...     answers(memo) is memo
    False
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from typing import Any, TypeVar

__all__ = ["answers", "uncached"]

_K = TypeVar("_K")
_V = TypeVar("_V")
_SCRATCH: list[dict[Any, Any]] = []


@contextlib.contextmanager
def uncached() -> Iterator[None]:
    """Keep answers only until the block ends: a function summarised in the middle of a walk
    sees what the walk has learnt so far, which must not outlive it."""
    _SCRATCH.append({})
    try:
        yield
    finally:
        _SCRATCH.pop()


def answers(memo: MutableMapping[_K, _V]) -> MutableMapping[_K, _V]:
    """The mapping to keep an answer in: ``memo`` (a module's), or the summary's scratch."""
    return _SCRATCH[-1] if _SCRATCH else memo
