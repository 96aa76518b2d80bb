"""The default process group: whether it is up, its collectives' device, and its teardown.

:func:`cleanup_distributed` ends every job (``finally:``), on the success path with a barrier
and on a failing rank without one (:mod:`gpu_training.failure`); :func:`process_group_up`
and :func:`collective_device` are what every helper that talks to other ranks asks first.
:func:`~gpu_training.dist_init.init_distributed` creates the group. All three are re-exported
by :mod:`gpu_training.ddp`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import types
import weakref
from typing import Any

import torch
import torch.distributed as dist

from gpu_training.failure import (
    exception_in_flight,
    exit_if_stuck,
    let_culprit_be_seen,
    record_failure,
)

__all__ = ["cleanup_distributed", "collective_device", "destroy_with_group", "process_group_up"]

_LRU_CACHE = type(functools.lru_cache(maxsize=None)(lambda: None))  # functools' cache wrapper
_DESTROYED_WITH_GROUP: weakref.WeakSet[Any] = weakref.WeakSet()


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


_HOLDERS = ("torch.distributed", "deepspeed")
"""The packages whose modules keep references to process groups (:func:`_release_references`)."""


def _release_references() -> None:
    """Drop the references torch's and DeepSpeed's modules keep to the destroyed groups.

    Three kinds, all invisible to ``gc.get_referrers`` (a pybind11 group is not tracked by the
    garbage collector, nor is a container holding only such objects):

    - ``group=group.WORLD`` default arguments: ``torch.distributed.nn.functional`` (imported
      by DDP's constructor), FSDP's ``ShardedGradScaler``, ZeRO's helpers and DeepSpeed's
      ``deepspeed.comm`` backend evaluate ``group.WORLD`` when they are imported; imported
      after ``init_process_group`` they keep the default group, and with it gloo's worker
      threads, alive after ``destroy_process_group()``. None means "the default group" to all
      of them, so this also stops them pointing at a destroyed group after a re-init.
    - Module globals: DeepSpeed's ``deepspeed.utils.groups._WORLD_GROUP``, its clone of the
      world group, and the watchdog's gloo side group (under NCCL), each made again on its
      next use; ZeRO-3's stack of the modules in forward
      (``FWD_MODULE_STACK``), where the root module, and through its hooks the engine, stays
      after every forward.
    - DTensor's caches (FSDP2, tensor parallelism): ``functools`` caches keyed or valued by a
      ``DeviceMesh`` (``MeshTopoInfo.build_from_mesh``, the transform plans), the
      redistribute planners and the sharding-propagation caches hold the mesh, and the mesh
      holds its groups. Cleared: a cache refills on its next use.
    """
    for name, module in list(sys.modules.items()):
        ours = name.startswith("gpu_training.")  # the watchdog's gloo side group under NCCL
        if not (ours or name.startswith(_HOLDERS)):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):  # sys.modules may hold stand-in objects
            continue
        for key, obj in list(namespace.items()):
            # type() checks only: some module attributes warn on any attribute access.
            if issubclass(type(obj), dist.ProcessGroup):
                namespace[key] = None
                continue
            if ours:
                continue
            if issubclass(type(obj), type) and vars(obj).get("__module__") == name:
                members = [
                    m.__func__ if type(m) in (staticmethod, classmethod) else m
                    for m in list(vars(obj).values())
                ]
            else:
                members = [obj]
            for fn in members:
                if type(fn) is types.FunctionType:
                    if fn.__module__ == name:
                        _drop_group_defaults(fn)
                    for cell in fn.__closure__ or ():  # a cache behind a decorator
                        with contextlib.suppress(ValueError):  # an empty cell
                            if type(cell.cell_contents) is _LRU_CACHE:
                                cell.cell_contents.cache_clear()
                elif type(fn) is _LRU_CACHE and getattr(fn, "__module__", None) == name:
                    fn.cache_clear()
    if "torch.distributed.tensor" in sys.modules:
        _clear_dtensor_caches()
    zero3 = sys.modules.get("deepspeed.runtime.zero.parameter_offload")
    stack = getattr(zero3, "FWD_MODULE_STACK", None)
    if isinstance(stack, list):
        stack.clear()  # ZeRO-3's modules in forward: its root stays there for good


def _clear_dtensor_caches() -> None:
    """DTensor's caches that are not module-level ``functools`` caches (torch 2.10 and later;
    a torch without one of them has nothing to clear there)."""
    with contextlib.suppress(ImportError, AttributeError):
        from torch.distributed.tensor import _redistribute

        _redistribute.clear_redistribute_planner_cache()
    # What torch.distributed.tensor.debug._clear_sharding_prop_cache does, without the 0.3 s
    # that importing that module takes.
    with contextlib.suppress(ImportError, AttributeError, RuntimeError):
        from torch.distributed.tensor import DTensor

        DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    with contextlib.suppress(AttributeError, RuntimeError):
        torch._C._clear_DTensor_sharding_propagator_cache()


def destroy_with_group(obj: Any) -> None:
    """Have :func:`cleanup_distributed` call ``obj.destroy()`` before it destroys the group.

    For DeepSpeed's engine (:func:`~gpu_training.strategy.deepspeed_initialize` registers
    each one): its ZeRO optimizer's gradient hooks live in the autograd graph, a reference
    cycle through C++ that the garbage collector cannot see, so without ``destroy()`` the
    engine and the groups it holds outlive the teardown, and gloo's threads reach interpreter
    shutdown (docs/design.md, "Traps"). Held weakly: an engine already freed is skipped. After
    the teardown the engine's hooks are gone; it is not meant to train again.

    Args:
        obj: An object with a ``destroy()`` method that runs no collective.
    """
    _DESTROYED_WITH_GROUP.add(obj)


def _destroy_registered() -> None:
    """``destroy()`` every live object :func:`destroy_with_group` registered, once."""
    for obj in list(_DESTROYED_WITH_GROUP):
        with contextlib.suppress(Exception):
            obj.destroy()
    _DESTROYED_WITH_GROUP.clear()


def cleanup_distributed() -> None:
    """Destroy the process group and its backend threads; idempotent, safe in ``finally``.

    On the success path a barrier comes first: without it gloo ranks that finish at different
    times abort at exit. If a peer is already gone the barrier fails, and the group is
    destroyed anyway. The objects :func:`destroy_with_group` registered (DeepSpeed's engines)
    are destroyed first; then the references torch and DeepSpeed keep to the destroyed groups
    (default arguments, module globals, DTensor's caches) are dropped, so every gloo backend
    (and its worker threads) is freed here, while the interpreter is fully alive, and not
    during interpreter shutdown. Free DDP-wrapped models
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
    groups = _every_group()
    with contextlib.suppress(Exception):
        dist.barrier()
    _destroy_registered()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    if dist.is_initialized():
        return  # destroy failed: the groups are still in use, leave their defaults alone
    # Gloo threads alive at interpreter shutdown can abort the process (docs/design.md, "Traps").
    _release_references()
    if any(group() is not None for group in groups):
        gc.collect()  # only a reference cycle can still hold one; a full collection is not free


def _every_group() -> list[weakref.ReferenceType[dist.ProcessGroup]]:
    """Weak references to every process group of this process (the default one and those
    ``new_group`` made: DeepSpeed's clone of the world, a device mesh's), to see whether
    the teardown freed them."""
    return [weakref.ref(group) for group in dist.distributed_c10d._world.pg_map]


def _teardown_after_failure(failure: BaseException) -> None:
    """The failing rank's teardown: no collective, the culprit on record, a bounded wait."""
    record_failure(failure)  # now: a rank killed later (torchrun's SIGTERM) is still named
    groups = _every_group()
    with exit_if_stuck(failure):
        if dist.get_backend() == "nccl":
            # NCCL can abort its communicators without waiting for the peers; gloo cannot.
            with contextlib.suppress(Exception):
                dist.distributed_c10d._abort_process_group()
        _destroy_registered()
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        if not dist.is_initialized():
            _release_references()
            if any(group() is not None for group in groups):
                gc.collect()  # a cycle holding a group: freed, its connections close now
    let_culprit_be_seen(failure)  # a victim: torchrun must see the rank that failed first
