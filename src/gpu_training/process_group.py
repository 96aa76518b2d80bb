"""The default process group: whether it is up, its collectives' device, and its teardown.

:func:`cleanup_distributed` ends every job (``finally:``), on the success path with a barrier
and on a failing rank without one (:mod:`gpu_training.failure`); :func:`process_group_up`
and :func:`collective_device` are what every helper that talks to other ranks asks first.
:func:`~gpu_training.dist_init.init_distributed` creates the group. All three are re-exported
by :mod:`gpu_training.ddp`.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import types
import weakref

import torch
import torch.distributed as dist

from gpu_training.failure import (
    exception_in_flight,
    exit_if_stuck,
    let_culprit_be_seen,
    record_failure,
)

__all__ = ["cleanup_distributed", "collective_device", "process_group_up"]


def process_group_up() -> bool:
    """Whether the default process group exists (``torch.distributed`` built and initialised).

    Example:
        >>> process_group_up()  # a single process that never joined a group
        False
    """
    return dist.is_available() and dist.is_initialized()


def collective_device() -> torch.device:
    """Where the default group's collectives take their tensors: CUDA for NCCL, else the CPU.

    NCCL only moves CUDA tensors (the current device's); gloo, alone or as the CPU half of
    ``"cpu:gloo,cuda:nccl"``, moves CPU ones. Call it with the group up.
    """
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _drop_group_defaults(fn: types.FunctionType) -> None:
    """Replace ProcessGroup default arguments of ``fn`` with None (the current default group)."""
    defaults = fn.__defaults__
    if defaults and any(isinstance(d, dist.ProcessGroup) for d in defaults):
        fn.__defaults__ = tuple(None if isinstance(d, dist.ProcessGroup) else d for d in defaults)
    kwdefaults = fn.__kwdefaults__
    if kwdefaults and any(isinstance(v, dist.ProcessGroup) for v in kwdefaults.values()):
        fn.__kwdefaults__ = {
            k: None if isinstance(v, dist.ProcessGroup) else v for k, v in kwdefaults.items()
        }


def _release_group_defaults() -> None:
    """Drop the destroyed groups that torch modules captured as ``group=group.WORLD`` defaults.

    ``torch.distributed.nn.functional`` (imported by DDP's constructor), FSDP's
    ``ShardedGradScaler`` and ZeRO's helpers evaluate ``group.WORLD`` when they are imported;
    imported after ``init_process_group`` they keep the default group, and with it gloo's
    worker threads, alive after ``destroy_process_group()``. None means "the default group"
    to all of them, so this also stops them pointing at a destroyed group after a re-init.
    """
    for name, module in list(sys.modules.items()):
        if not name.startswith("torch.distributed"):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):  # sys.modules may hold stand-in objects
            continue
        for obj in list(namespace.values()):
            # type() checks only: some module attributes warn on any attribute access.
            if issubclass(type(obj), type) and vars(obj).get("__module__") == name:
                members = [
                    m.__func__ if type(m) in (staticmethod, classmethod) else m
                    for m in list(vars(obj).values())
                ]
            else:
                members = [obj]
            for fn in members:
                if type(fn) is types.FunctionType and fn.__module__ == name:
                    _drop_group_defaults(fn)


def cleanup_distributed() -> None:
    """Destroy the process group and its backend threads; idempotent, safe in ``finally``.

    On the success path a barrier comes first: without it gloo ranks that finish at different
    times abort at exit. If a peer is already gone the barrier fails, and the group is
    destroyed anyway. Then the references torch itself keeps to the destroyed group are
    dropped, so the gloo backend (and its worker threads) is freed here, while the
    interpreter is fully alive, and not during interpreter shutdown. Free DDP-wrapped models
    before calling this: a DDP model that is still referenced keeps the group alive (its
    reducer holds it).

    With an exception in flight (called from a ``finally:`` or ``except`` block, or an
    ``__exit__``, while a rank fails) there is no barrier: the peers are blocked in another
    collective and it would never complete. The exception is written at once as torchrun's
    error record of this rank (:func:`gpu_training.failure.record_failure`), the group is
    aborted or destroyed without waiting for the peers, and if that still blocks (gloo
    finishing a collective no peer will join) for more than
    :data:`~gpu_training.failure.FAILED_TEARDOWN_TIMEOUT_S` seconds, the exception is
    reported and the process exits with code 1. The exception then propagates as usual.
    """
    if not process_group_up():
        return
    failure = exception_in_flight()
    if failure is not None:
        _teardown_after_failure(failure)
        return
    default_group = dist.group.WORLD
    world = weakref.ref(default_group) if default_group is not None else None
    del default_group
    with contextlib.suppress(Exception):
        dist.barrier()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    if dist.is_initialized():
        return  # destroy failed: the groups are still in use, leave their defaults alone
    # Gloo threads alive at interpreter shutdown can abort the process (docs/design.md, "Traps").
    _release_group_defaults()
    if world is not None and world() is not None:
        gc.collect()  # only a reference cycle can still hold it; a full collection is not free


def _teardown_after_failure(failure: BaseException) -> None:
    """The failing rank's teardown: no collective, the culprit on record, a bounded wait."""
    record_failure(failure)  # now: a rank killed later (torchrun's SIGTERM) is still named
    default_group = dist.group.WORLD
    world = weakref.ref(default_group) if default_group is not None else None
    del default_group
    with exit_if_stuck(failure):
        if dist.get_backend() == "nccl":
            # NCCL can abort its communicators without waiting for the peers; gloo cannot.
            with contextlib.suppress(Exception):
                dist.distributed_c10d._abort_process_group()
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        if not dist.is_initialized():
            _release_group_defaults()
            if world is not None and world() is not None:
                gc.collect()  # a cycle holding the group: freed, its connections close now
    let_culprit_be_seen(failure)  # a victim: torchrun must see the rank that failed first
