"""The calls that return a process's rank, whichever library makes the group.

``torch.distributed.get_rank()`` and the ``get_local_rank()`` helpers of the libraries and of the
projects themselves, and Horovod's ``hvd.rank()`` / ``hvd.local_rank()`` (its ``hvd.barrier()``
pairs with them: ``if hvd.rank() != 0: hvd.barrier()``, download, ``if hvd.rank() == 0:
hvd.barrier()`` lets rank 0 go first). A bare ``.rank()`` of another object is not one.
"""

from __future__ import annotations

__all__ = ["RANK_CALLS", "rank_call"]

RANK_CALLS = frozenset({"get_rank", "get_local_rank", "get_global_rank", "get_node_local_rank"})
_HOROVOD_RANKS = frozenset({"rank", "local_rank"})


def rank_call(name: str | None) -> bool:
    """Whether a call of ``name`` (its qualified name) returns a rank.

    Example:
        >>> rank_call("horovod.torch.rank"), rank_call("torch.distributed.get_rank")
        (True, True)
        >>> rank_call("numpy.linalg.matrix_rank"), rank_call("tensor.rank")
        (False, False)
    """
    last = (name or "").rsplit(".", 1)[-1]
    return last in RANK_CALLS or (
        name is not None and name.startswith("horovod.") and last in _HOROVOD_RANKS
    )
