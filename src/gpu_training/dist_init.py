"""Joining a job: who this process is, the process group, and the device it trains on.

:class:`DistributedContext` is the rank identity torchrun (or ``srun``) injects;
:func:`init_distributed` joins the group it describes (nccl with GPUs, gloo otherwise; a no-op
in one process) and :func:`resolve_device` picks this rank's device. All are re-exported by
:mod:`gpu_training.ddp`, where the guides import them.

Example:
    >>> ctx = DistributedContext.from_env({})   # no launcher: rank 0 of 1
    >>> ctx.is_main_process, ctx.is_distributed
    (True, False)
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gpu_training import flight_recorder
from gpu_training.failure import exception_in_flight
from gpu_training.process_group import process_group_up

__all__ = ["DEFAULT_TIMEOUT", "DistributedContext", "init_distributed", "resolve_device"]

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


# Named for gpu_training.ddp, where users import from_env (its docstring names the logger).
_logger = logging.getLogger("gpu_training.ddp")
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


def _cuda_usable(ctx: DistributedContext) -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def init_distributed(
    backend: str | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    *,
    record_collectives: bool = False,
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
        record_collectives: Switch torch's flight recorder on for the group (what a stall
            watchdog reads when it fires: :mod:`~gpu_training.flight_recorder`); also on when
            ``GPU_TRAINING_STALL_TIMEOUT`` is set.

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
    watched = os.environ.get(flight_recorder.WATCHDOG_ENV, "").strip() not in ("", "0")
    if record_collectives or watched:  # a stall watchdog will read it
        flight_recorder.enable()
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
    ``c10d::Logger::set_env_variables`` (reproducibly, a minimal script too:
    benchmarks/README.md, "Traps"), which casts the wrapper to ``ProcessGroupGloo``. DDP
    looks its logger class up as ``torch.distributed.Logger`` at construction, so a subclass
    that skips only that record keeps everything else (runtime stats, error logging, the
    reducer's hooks). The construction-time fields of ``_get_ddp_logging_data()`` are then
    missing.
    """
    if not issubclass(dist.Logger, _DetailSafeLogger):
        dist.Logger = _DetailSafeLogger  # type: ignore[misc]


def resolve_device(ctx: DistributedContext) -> torch.device:
    """``cuda:<local_rank>`` when GPUs are available, else ``cpu``."""
    if _cuda_usable(ctx):
        return torch.device("cuda", ctx.local_rank % torch.cuda.device_count())
    return torch.device("cpu")
