"""DistributedDataParallel done right: rank identity, process group, sharding, metrics, teardown.

The same script runs unchanged in a notebook (one process) and under ``torchrun``::

    from gpu_training.ddp import init_distributed, resolve_device, cleanup_distributed

    ctx = init_distributed()          # nccl with GPUs, gloo otherwise; no-op in one process
    device = resolve_device(ctx)      # cuda:<local_rank>, or cpu
    try:
        ...
    finally:
        cleanup_distributed()         # idempotent; no barrier when an exception is in flight

Every helper here that talks to other ranks is called by every rank; only
``ctx.is_main_process`` prints or writes.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import sys
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from gpu_training.amp import MixedPrecisionTrainer
from gpu_training.failure import (
    exception_in_flight,
    exit_if_stuck,
    let_culprit_be_seen,
    record_failure,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "DistributedContext",
    "cleanup_distributed",
    "gradient_sync",
    "init_distributed",
    "make_distributed_sampler",
    "move_to_device",
    "process_group_up",
    "reduce_scalar_dict",
    "resolve_device",
    "train_one_epoch",
    "unwrap_model",
]

DEFAULT_TIMEOUT = timedelta(minutes=30)
"""Process-group timeout: how long a collective waits for a missing rank before raising."""


def _env_int(name: str, default: int, env: Mapping[str, str]) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


_logger = logging.getLogger(__name__)
_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
_SRUN_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
_TASKS_PER_NODE_RE = re.compile(r"(\d+)(?:\(x(\d+)\))?")  # "4" or "4(x2)"


def _srun_started_this_task(env: Mapping[str, str]) -> bool:
    """True when ``srun`` started this process as one task of a multi-task step."""
    if not all(env.get(name) for name in _SRUN_VARS):
        return False
    # A batch script itself also sees SLURM_NTASKS and PROCID 0, but it is one process:
    # only srun's tasks get the step variables.
    return env.get("ENVIRONMENT") != "BATCH" or "SLURM_STEP_NUM_TASKS" in env


def _slurm_tasks_on_node(env: Mapping[str, str], local_rank: int, world_size: int) -> int:
    """Tasks on this node: SLURM_NTASKS_PER_NODE, else this node's entry of "2(x3),1"."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return _env_int("SLURM_NTASKS_PER_NODE", 1, env)
    layout = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    counts: list[int] = []
    for part in layout.split(","):
        match = _TASKS_PER_NODE_RE.fullmatch(part.strip())
        if match is None:
            counts = []
            break
        counts += [int(match[1])] * int(match[2] or 1)
    node = _env_int("SLURM_NODEID", 0, env)
    if node < len(counts):
        return counts[node]
    return world_size if _env_int("SLURM_NNODES", 1, env) == 1 else local_rank + 1


def _context_from_slurm(
    cls: type[DistributedContext], env: Mapping[str, str]
) -> DistributedContext:
    """The context of an ``srun``-per-GPU task (no torchrun): SLURM's task variables."""
    rank = _env_int("SLURM_PROCID", 0, env)
    local_rank = _env_int("SLURM_LOCALID", 0, env)
    world_size = _env_int("SLURM_NTASKS", 1, env)
    local_world_size = _slurm_tasks_on_node(env, local_rank, world_size)
    try:
        ctx = cls(rank, local_rank, world_size, local_world_size)
    except ValueError as err:
        raise ValueError(f"inconsistent SLURM environment (srun task variables): {err}") from None
    _logger.info(
        "rank %d of %d (local %d of %d) from SLURM srun variables "
        "(SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS): no torchrun variables set",
        rank,
        world_size,
        local_rank,
        local_world_size,
    )
    if world_size > 1 and not (env.get("MASTER_ADDR") and env.get("MASTER_PORT")):
        _logger.warning(
            "srun started %d tasks but MASTER_ADDR/MASTER_PORT are not set: init_distributed "
            'needs them, e.g. export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST"'
            " | head -n 1) MASTER_PORT=29500 in the batch script",
            world_size,
        )
    return ctx


@dataclass(frozen=True)
class DistributedContext:
    """Who this process is in the job.

    Attributes:
        rank: Global rank, 0 … world_size-1.
        local_rank: Rank within this node; selects the GPU.
        world_size: Number of processes in the job.
        local_world_size: Number of processes on this node.
        backend: The process-group backend once initialised (``None`` in one process).
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    backend: str | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local_rank must be in [0, local_world_size={self.local_world_size}), "
                f"got {self.local_rank}"
            )

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0: the one rank that prints, logs and writes files."""
        return self.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on local rank 0 (one per node: node-local caches, downloads)."""
        return self.local_rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DistributedContext:
        """Read the rank identity torchrun (or ``srun``) injects, or fall back to one process.

        Reads torchrun's ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``. When
        none of them is set but ``srun`` started this process as one task per GPU, reads
        ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS`` and ``SLURM_NTASKS_PER_NODE``
        instead (``init_distributed`` then also needs ``MASTER_ADDR`` and ``MASTER_PORT``).
        Otherwise the context is rank 0 of 1, so scripts also run in a notebook. Which source
        was used is logged (logger ``gpu_training.ddp``, level INFO).

        Args:
            env: Mapping to read instead of ``os.environ`` (for tests).

        Example:
            >>> DistributedContext.from_env({}).world_size
            1
            >>> ctx = DistributedContext.from_env({"RANK": "3", "WORLD_SIZE": "4"})
            >>> ctx.rank, ctx.local_rank, ctx.is_main_process
            (3, 3, False)
            >>> slurm = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8",
            ...          "SLURM_NTASKS_PER_NODE": "4"}
            >>> DistributedContext.from_env(slurm)
            DistributedContext(rank=5, local_rank=1, world_size=8, local_world_size=4, backend=None)

        Raises:
            ValueError: When a variable is not an integer or the values are inconsistent.
        """
        env = os.environ if env is None else env
        if not any(env.get(name) for name in _TORCHRUN_VARS) and _srun_started_this_task(env):
            return _context_from_slurm(cls, env)
        world_size = _env_int("WORLD_SIZE", 1, env)
        rank = _env_int("RANK", 0, env)
        local_rank = _env_int("LOCAL_RANK", rank if world_size > 1 else 0, env)
        local_world_size = _env_int("LOCAL_WORLD_SIZE", max(world_size, local_rank + 1), env)
        try:
            ctx = cls(rank, local_rank, world_size, local_world_size)
        except ValueError as err:
            raise ValueError(f"inconsistent torchrun environment: {err}") from None
        source = "torchrun variables" if "WORLD_SIZE" in env else "no launcher: one process"
        _logger.info("rank %d of %d (local %d) from %s", rank, world_size, local_rank, source)
        return ctx

    def barrier(self) -> None:
        """Wait for every rank (no-op in one process or before the group exists).

        Also a no-op while an exception is in flight (called from a ``finally:`` block of a
        failing rank): the other ranks are in another collective and would never join.
        """
        if exception_in_flight() is not None:
            return
        if self.is_distributed and process_group_up():
            dist.barrier()


def process_group_up() -> bool:
    """Whether the default process group exists (``torch.distributed`` built and initialised).

    Example:
        >>> process_group_up()  # a single process that never joined a group
        False
    """
    return dist.is_available() and dist.is_initialized()


def _cuda_usable(ctx: DistributedContext) -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def init_distributed(
    backend: str | None = None, timeout: timedelta = DEFAULT_TIMEOUT
) -> DistributedContext:
    """Join the process group described by the environment (no-op in one process).

    Picks ``nccl`` when CUDA is available and ``gloo`` otherwise; asking for ``nccl`` on a
    machine without GPUs falls back to ``gloo`` with a warning, so the same script runs on a
    laptop. On CUDA it calls ``torch.cuda.set_device(local_rank)`` *before* creating the
    group — skipping that puts every rank on ``cuda:0``. With
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` on gloo it also works around the upstream crash that
    otherwise kills every DDP model at construction (see :func:`_skip_ddp_construction_log`).

    Args:
        backend: ``"nccl"``, ``"gloo"``, or None to choose.
        timeout: How long a collective waits for a missing rank before raising.

    Returns:
        The :class:`DistributedContext` of this process (``backend`` set when distributed).

    Raises:
        RuntimeError: When ``LOCAL_RANK`` names a GPU that is not visible.
    """
    ctx = DistributedContext.from_env()
    if not ctx.is_distributed:
        return ctx
    if dist.is_initialized():  # already joined (e.g. by a framework): report, don't re-init
        backend = str(dist.get_backend())
        if backend == "gloo" and dist.get_debug_level() == dist.DebugLevel.DETAIL:
            _skip_ddp_construction_log()
        return replace(ctx, backend=backend)
    cuda = _cuda_usable(ctx)
    if backend is None:
        backend = "nccl" if cuda else "gloo"
    elif backend == "nccl" and not cuda:
        warnings.warn("backend 'nccl' needs CUDA GPUs; none found, using 'gloo'", stacklevel=2)
        backend = "gloo"
    if cuda:
        if ctx.local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK={ctx.local_rank} but only {torch.cuda.device_count()} GPU(s) are "
                "visible: check CUDA_VISIBLE_DEVICES against --nproc_per_node"
            )
        # Before the group: otherwise NCCL binds every rank to cuda:0.
        torch.cuda.set_device(ctx.local_rank)
    dist.init_process_group(
        backend=backend, rank=ctx.rank, world_size=ctx.world_size, timeout=timeout
    )
    if backend == "gloo" and dist.get_debug_level() == dist.DebugLevel.DETAIL:
        _skip_ddp_construction_log()
    return replace(ctx, backend=backend)


class _DetailSafeLogger(dist.Logger):
    """DDP's logger without the construction-time record that crashes under DETAIL on gloo."""

    def set_construction_data_and_log(self, *args: Any, **kwargs: Any) -> None:
        # It static_casts the GLOO backend to ProcessGroupGloo, which under DETAIL is the
        # debug ProcessGroupWrapper: SIGSEGV (torch/csrc/distributed/c10d/logger.cpp).
        return None


def _skip_ddp_construction_log() -> None:
    """Let DDP be built on a gloo group in ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` mode.

    With DETAIL, every gloo group is wrapped in torch's ``ProcessGroupWrapper`` (the
    collective fingerprint check); DDP's constructor then segfaults in
    ``c10d::Logger::set_env_variables`` (measured on torch 2.13 CPU: 3 of 3 jobs, a 5-line
    script too), which casts the wrapper to ``ProcessGroupGloo``. DDP looks its logger class
    up as ``torch.distributed.Logger`` at construction, so a subclass that skips only that
    record keeps everything else (runtime stats, error logging, the reducer's hooks). The
    construction-time fields of ``_get_ddp_logging_data()`` are then missing.
    """
    if not issubclass(dist.Logger, _DetailSafeLogger):
        dist.Logger = _DetailSafeLogger  # type: ignore[misc]


def resolve_device(ctx: DistributedContext) -> torch.device:
    """``cuda:<local_rank>`` when GPUs are available, else ``cpu``."""
    if _cuda_usable(ctx):
        return torch.device("cuda", ctx.local_rank % torch.cuda.device_count())
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
    # Gloo threads alive at interpreter shutdown can abort the process (DESIGN.md, exit abort).
    _release_group_defaults()
    if world is not None and world() is not None:
        gc.collect()  # only a reference cycle can still hold it; a full collection costs ~0.1 s


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


def make_distributed_sampler(
    dataset: Dataset[Any],
    ctx: DistributedContext,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> DistributedSampler[Any] | None:
    """A :class:`DistributedSampler` for this rank, or None in a single process.

    Returning None keeps the ``DataLoader(..., sampler=sampler, shuffle=(sampler is None))``
    idiom valid in both cases. Remember ``sampler.set_epoch(epoch)`` every epoch
    (:func:`train_one_epoch` does it).

    With ``drop_last=False`` and a dataset size not divisible by the world size, the sampler
    pads by repeating a few samples so that every rank gets the same count.
    """
    if not ctx.is_distributed:
        return None
    return DistributedSampler(
        dataset,
        num_replicas=ctx.world_size,
        rank=ctx.rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce_scalar_dict(
    values: Mapping[str, float | int | torch.Tensor],
    ctx: DistributedContext,
    average: bool = True,
) -> dict[str, float]:
    """All-reduce a dict of scalars in one collective; every rank gets the result.

    Each rank computes loss on its own shard, so rank 0's number is not the global one.

    Args:
        values: Name → Python number or 0-d/1-element tensor. Every rank must pass the same
            keys (they are sorted, so insertion order does not matter).
        ctx: This process's context.
        average: Divide the sum by the world size.

    Returns:
        Name → reduced float, identical on every rank.

    Raises:
        ValueError: If a value is a tensor with more than one element.
    """
    keys = sorted(values)
    flat: list[float | torch.Tensor] = []
    for key in keys:
        value = values[key]
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"value {key!r} must be a scalar, got shape {tuple(value.shape)}")
            value = value.detach().reshape(())
        flat.append(value)
    if not (ctx.is_distributed and process_group_up()):
        return {k: float(v) for k, v in zip(keys, flat, strict=True)}
    device = _collective_device()
    packed = (
        torch.stack(
            [torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in flat]
        )
        if flat
        else torch.zeros(0, dtype=torch.float64, device=device)
    )
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    if average:
        packed /= ctx.world_size
    return dict(zip(keys, packed.tolist(), strict=True))


def _wrapper_inner(model: nn.Module) -> nn.Module | None:
    """The module a known wrapper holds, or None when ``model`` is not a wrapper."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    if isinstance(model, (DistributedDataParallel, DataParallel)):
        return model.module
    orig = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
    if isinstance(orig, nn.Module):
        return orig
    with contextlib.suppress(ImportError):
        from torch.distributed.fsdp import FullyShardedDataParallel

        if isinstance(model, FullyShardedDataParallel):
            return model.module
    inner = getattr(model, "module", None)  # DeepSpeedEngine and Lightning-style wrappers
    if isinstance(inner, nn.Module) and type(model).__name__ in {
        "DeepSpeedEngine",
        "_FabricModule",
        "_LightningModuleWrapperBase",
    }:
        return inner
    return None


def unwrap_model(model: nn.Module) -> nn.Module:
    """Strip DDP, DataParallel, FSDP1, DeepSpeed and ``torch.compile`` wrappers (nested too).

    Save ``unwrap_model(model).state_dict()``: its keys carry no ``module.`` /
    ``_orig_mod.`` prefixes and load into a plain model for inference. (FSDP2's
    ``fully_shard`` changes the module in place and needs no unwrapping.)
    """
    seen = 0
    while (inner := _wrapper_inner(model)) is not None:
        model = inner
        seen += 1
        if seen > 16:  # a wrapper that points at itself would loop forever
            raise RuntimeError("unwrap_model: wrapper chain deeper than 16")
    return model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce inside the block when ``enabled`` is False.

    DDP all-reduces on every ``backward()``; during accumulation that syncs gradients you
    are about to keep summing. This uses ``model.no_sync()`` (DDP) or FSDP2's
    ``set_requires_gradient_sync`` and does nothing for a plain module.
    """
    if enabled:
        yield
        return
    no_sync = getattr(model, "no_sync", None)
    if callable(no_sync):
        with no_sync():
            yield
        return
    setter = getattr(model, "set_requires_gradient_sync", None)
    if callable(setter):
        setter(False)
        try:
            yield
        finally:
            setter(True)
        return
    yield


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Move tensors in a (nested) tuple/list/dict batch to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, Mapping):
        return {k: move_to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device) for v in batch)
    return batch


def _set_epoch(loader: Iterable[Any], epoch: int) -> bool:
    batch_sampler = getattr(loader, "batch_sampler", None)
    # A DistributedSampler sits at loader.sampler; a GlobalBatchSampler is the batch_sampler.
    for candidate in (
        getattr(loader, "sampler", None),
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
    ):
        if candidate is not None and callable(getattr(candidate, "set_epoch", None)):
            candidate.set_epoch(epoch)
            return True
    return False


def train_one_epoch(
    model: nn.Module,
    loader: DataLoader[Any] | Iterable[Any],
    trainer: MixedPrecisionTrainer,
    loss_fn: Callable[..., torch.Tensor],
    ctx: DistributedContext,
    *,
    epoch: int,
    device: torch.device | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    max_steps: int | None = None,
) -> dict[str, float]:
    """One pass over ``loader`` with accumulation, ``no_sync``, AMP and clipping done right.

    For each micro-batch ``(x, y)``: forward under ``trainer.autocast()``, ``trainer.backward``
    inside ``no_sync`` unless it closes an accumulation window, then ``trainer.step_async``
    (which acts only on boundaries) and ``scheduler.step()`` after each optimizer step. The
    host never waits for the device inside the epoch: losses and norms add up on the device
    and are read once at the end. Calls
    ``sampler.set_epoch(epoch)`` first. Trailing micro-batches that cannot fill a whole
    accumulation window are not trained on (their gradient would leak into the next epoch).

    Args:
        model: The (DDP-wrapped or plain) model.
        loader: Yields ``(inputs, targets)`` pairs.
        trainer: Holds the optimizer, precision and accumulation.
        loss_fn: ``loss_fn(model(inputs), targets)`` → scalar mean loss of the micro-batch.
        ctx: This process's context; metrics are averaged over its ranks.
        epoch: Epoch number, passed to ``sampler.set_epoch``.
        device: Where to move batches (default: the model's parameters' device).
        scheduler: LR scheduler stepped once per optimizer step.
        max_steps: Stop after this many optimizer steps.

    Returns:
        Averaged over ranks: ``loss`` (mean micro-batch loss), ``grad_norm`` (mean over the
        steps whose norm was measured: every step when the trainer clips, which measures them
        anyway, or when the loader has no ``len()`` and no ``max_steps`` bounds it; otherwise
        only the last step's), ``lr`` (at the end), and the counts ``steps``, ``skipped_steps`` and
        ``samples`` (per rank).
    """
    if not _set_epoch(loader, epoch) and ctx.is_distributed:
        warnings.warn(
            "train_one_epoch: the loader has no sampler with set_epoch(); without a "
            "DistributedSampler every rank trains on the same data",
            stacklevel=2,
        )
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    accum = trainer.grad_accum_steps
    usable: int | None = None
    if hasattr(loader, "__len__"):
        usable = (len(loader) // accum) * accum  # type: ignore[arg-type]
    model.train()
    # Running sums stay on the device: a .item() per micro-batch would sync the host.
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    norm_sum = torch.zeros((), dtype=torch.float64, device=device)
    norms = 0  # norms in norm_sum
    last_step = None if usable is None else usable // accum  # None: not known in advance
    if max_steps is not None:
        last_step = max_steps if last_step is None else min(last_step, max_steps)
    micro_batches = steps = skipped = samples = 0
    on_cpu = device.type == "cpu"
    losses: list[torch.Tensor] = []  # folded into loss_sum in chunks: one op per chunk
    for micro, batch in enumerate(loader):
        if usable is not None and micro >= usable:
            break
        inputs, targets = batch if on_cpu else move_to_device(batch, device)
        boundary = (micro + 1) % accum == 0
        # The boundary micro-batch syncs as usual: nothing to switch off, nothing to enter.
        with contextlib.nullcontext() if boundary else gradient_sync(model, enabled=False):
            with trainer.autocast():
                loss = loss_fn(model(inputs), targets)
            trainer.backward(loss)
        losses.append(loss.detach())
        if len(losses) == 256:
            loss_sum += torch.stack(losses).sum(dtype=torch.float64)
            losses.clear()
        samples += len(inputs)
        micro_batches += 1
        # Without clipping, a norm costs a pass over the gradients: measure the last one only.
        measure = last_step is None or steps + 1 == last_step
        norm = trainer.step_async(model.parameters(), micro, norm=measure)
        if norm is not None:
            steps += 1
            if trainer.last_step_skipped:
                skipped += 1
            elif norm.computed:
                norm_sum += norm.tensor().to(norm_sum)
                norms += 1
            if scheduler is not None:
                scheduler.step()
            if max_steps is not None and steps >= max_steps:
                break
    if losses:
        loss_sum += torch.stack(losses).sum(dtype=torch.float64)
    if micro_batches % accum:
        # An unfinished window (loader without len()): drop its gradient rather than leak it.
        trainer.optimizer.zero_grad(set_to_none=True)
    metrics = reduce_scalar_dict(
        {
            "loss": loss_sum / max(1, micro_batches),
            "grad_norm": norm_sum / max(1, norms),
            "steps": steps,
            "skipped_steps": skipped,
            "samples": samples,
        },
        ctx,
        average=True,
    )
    metrics["lr"] = float(trainer.optimizer.param_groups[0]["lr"])
    return metrics
