"""A project's own sampler class built on ``DistributedSampler`` (``GT005``).

``class StatefulDistributedSampler(DistributedSampler)`` (resumable from a start index, or
with a tensor-parallel path) inherits the base class's ``set_epoch`` and its epoch-seeded
shuffle: constructed with ``shuffle`` not ``False`` (the base's default is ``True``), it draws
the same order every epoch unless someone calls ``set_epoch``, as ``DistributedSampler``
itself does. The classes read are the module's own, through their bases in the same module
(``class A(DistributedSampler)``, ``class B(A)``).

Example:
    >>> import ast
    >>> tree = ast.parse("from torch.utils.data import DistributedSampler\\n"
    ...                  "class Resumable(DistributedSampler):\\n"
    ...                  "    def __init__(self, data, shuffle=True, seed=0): ...\\n")
    >>> cls = tree.body[1]
    >>> sampler_shuffle_index({"Resumable": cls}, "Resumable", {"DistributedSampler"})
    1
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping

from gpu_training.diagnostics.lint.calls import parameter_index, tail
from gpu_training.diagnostics.lint.model import dotted

__all__ = ["sampler_shuffle_index"]


def sampler_shuffle_index(
    toplevel: Mapping[str, ast.stmt],
    name: str,
    bases: set[str],
    resolve: Callable[[str | None], str | None] = lambda n: n,
) -> int | None:
    """Where a call of class ``name`` (a class of the module, by its ``toplevel`` statements)
    passes ``shuffle`` by position, when the class derives from one of ``bases`` (last names,
    resolved through the module's imports by ``resolve``); None when it does not derive from
    them. A constructor without a ``shuffle`` parameter gives ``99`` (never positional)."""
    cls = toplevel.get(name)
    seen: set[str] = set()
    chain: ast.ClassDef | None = cls if isinstance(cls, ast.ClassDef) else None
    start = chain
    while chain is not None and chain.name not in seen:
        seen.add(chain.name)
        base_names = [n for n in map(dotted, chain.bases) if n is not None]
        if any(tail(resolve(b)) in bases for b in base_names if b not in toplevel):
            break
        parent = next((toplevel.get(b) for b in base_names if b in toplevel), None)
        chain = parent if isinstance(parent, ast.ClassDef) else None
    if chain is None or start is None:
        return None
    init = next(
        (
            n
            for n in start.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__"
        ),
        None,
    )
    if init is None:
        return 3  # DistributedSampler(dataset, num_replicas, rank, shuffle, ...)
    index = parameter_index(init, "shuffle")
    return index if index >= 0 else 99
