"""The training loader a run builds from its task's data: map-style or a stream.

* A map-style dataset: :class:`~gpu_training.data.GlobalBatchSampler` as the DataLoader's
  batch sampler (shuffled per epoch, resumable at any world size).
* A :class:`~gpu_training.streaming.SampleStream`: the global sample cursor
  (:class:`~gpu_training.streaming.StreamPosition`), read in order, resumable at any world
  size, with the task's DataLoader workers.
* An iterable dataset with ``state_dict`` / ``load_state_dict`` (torchdata's convention):
  read as the user shards it, in the training process; every rank's state is saved and
  restored (:class:`~gpu_training.stateful_stream.StatefulPosition`), same world size only.
* Any other iterable dataset: read as the user shards it; it trains, but cannot resume
  (:class:`~gpu_training.streaming.NoPosition` refuses in one line).

Whichever it is, :attr:`TrainData.position` is what checkpoints carry (``state_dict`` /
``load_state_dict``) and what the loop moves to the next epoch (``set_epoch``).

Example:
    >>> from gpu_training.config import TrainingConfig
    >>> from gpu_training.ddp import DistributedContext
    >>> from gpu_training.streaming import RangeStream
    >>> cfg = TrainingConfig(global_batch_size=4, per_device_batch_size=2, max_steps=3)
    >>> data = build_train_data(RangeStream(100), cfg, DistributedContext())
    >>> data.total, [batch.tolist() for batch in data.loader][:2]
    (3, [[0, 1], [2, 3]])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, default_collate

from gpu_training.config import ConfigError, TrainingConfig
from gpu_training.data import GlobalBatchSampler
from gpu_training.ddp import DistributedContext
from gpu_training.stateful_stream import StatefulPosition, is_stateful_iterable
from gpu_training.streaming import (
    NoPosition,
    RankStream,
    StreamLoader,
    StreamPosition,
    is_sample_stream,
)

__all__ = ["DataPosition", "TrainData", "build_train_data", "check_train_data", "resume_refusal"]


class DataPosition(Protocol):
    """Where the run is in its data: a sampler's epoch and position, or a stream's cursor."""

    @property
    def epoch(self) -> int:
        """The current epoch."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Select an epoch."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (plain data)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` says."""
        ...


@dataclass
class TrainData:
    """What the Trainer iterates and what its checkpoints carry."""

    position: DataPosition
    """The data position checkpoints save and restore."""
    loader: Iterable[Any]
    """This rank's micro-batches of the rest of the epoch, per ``iter``."""
    generators: dict[str, torch.Generator]
    """Private generators whose state checkpoints carry (the loader's)."""
    total: int
    """Optimizer steps of the whole run."""


def _is_map_style(train: Any) -> bool:
    return hasattr(train, "__getitem__") and hasattr(train, "__len__")


def check_train_data(train: Any, cfg: TrainingConfig) -> int:
    """Optimizer steps of the run, or one line on what does not fit.

    Args:
        train: The task's training data.
        cfg: The training section.

    Raises:
        ConfigError: A dataset holding no global batch, or a stream without ``max_steps``.
    """
    if not _is_map_style(train) or is_sample_stream(train):
        if cfg.max_steps is None:
            raise ConfigError(
                "field 'training.max_steps': the training data is a stream (no length, so no "
                "epochs to count): set training.max_steps",
                "training.max_steps",
            )
        return cfg.max_steps
    size = len(train)
    if size < cfg.effective_batch_size:
        raise ConfigError(
            f"field 'training.global_batch_size': the training set ({size} samples) holds no "
            f"global batch of {cfg.effective_batch_size}: lower training.global_batch_size",
            "training.global_batch_size",
        )
    return cfg.total_steps(size)


def resume_refusal(train: Any) -> str | None:
    """Why a run over ``train`` cannot resume (a stream without the protocol), else None."""
    if _is_map_style(train) or is_sample_stream(train) or is_stateful_iterable(train):
        return None
    try:
        NoPosition(type(train).__name__).load_state_dict({})
    except ConfigError as err:
        return str(err)
    return None  # pragma: no cover - NoPosition always refuses


def build_train_data(
    train: Any,
    cfg: TrainingConfig,
    ctx: DistributedContext,
    *,
    workers: int = 0,
    pin_memory: bool = False,
) -> TrainData:
    """The loader and data position of ``train`` for this rank.

    Args:
        train: A map-style dataset, a :class:`~gpu_training.streaming.SampleStream`, an
            iterable dataset with ``state_dict``/``load_state_dict``, or one without either.
        cfg: The training section for this world size.
        ctx: This rank and the world size.
        workers: DataLoader workers for a stream (map-style data is read in the process).
        pin_memory: Pin batches (CUDA).

    Raises:
        ConfigError: As :func:`check_train_data`; for a stateful iterable, also workers > 0
            or a ``state_dict()`` that is not data.
    """
    total = check_train_data(train, cfg)
    # A private generator: each iter(DataLoader) must not draw from the global RNG.
    generator = torch.Generator().manual_seed(cfg.seed)
    gens = {"loader": generator}
    b, accumulation = cfg.per_device_batch_size, cfg.gradient_accumulation_steps
    if is_sample_stream(train):
        position = StreamPosition(cfg.effective_batch_size)
        ranked = RankStream(
            train,
            position,
            rank=ctx.rank,
            world_size=ctx.world_size,
            per_device_batch_size=b,
            accumulation=accumulation,
            collate=default_collate,
        )
        # batch_size=None: the stream yields whole micro-batches, collated in the workers.
        loader = DataLoader(
            ranked, batch_size=None, num_workers=workers, generator=generator, pin_memory=pin_memory
        )
        return TrainData(position, StreamLoader(loader, position, accumulation), gens, total)
    if is_stateful_iterable(train):
        return _stateful_data(train, cfg, ctx, workers, pin_memory, gens, total)
    if not _is_map_style(train):
        plain = DataLoader(train, batch_size=b, num_workers=workers, pin_memory=pin_memory)
        return TrainData(
            NoPosition(type(train).__name__), StreamLoader(plain, None, 1), gens, total
        )
    sampler = GlobalBatchSampler(len(train), cfg.effective_batch_size, b, ctx, seed=cfg.seed)
    loader = DataLoader(train, batch_sampler=sampler, generator=generator, pin_memory=pin_memory)
    return TrainData(sampler, loader, gens, total)


def _stateful_data(
    train: Any,
    cfg: TrainingConfig,
    ctx: DistributedContext,
    workers: int,
    pin_memory: bool,
    gens: dict[str, torch.Generator],
    total: int,
) -> TrainData:
    name = type(train).__name__
    if workers:
        # a worker's copy reads ahead of the step: its state is not the step's, and unseen
        raise ConfigError(
            f"the training stream {name} keeps its own state (state_dict/load_state_dict) and "
            f"is read in the training process: set the task's loader workers to 0 (got "
            f"{workers}), or implement records(start)/decode(record) to read it with workers"
        )
    position = StatefulPosition(train, ctx, cfg.effective_batch_size)
    position.own_state()  # a state that is not data: refused now, not at the first save
    b = cfg.per_device_batch_size
    # num_workers=0: the DataLoader pulls b samples per micro-batch, none ahead of the step
    plain = DataLoader(train, batch_size=b, num_workers=0, pin_memory=pin_memory)
    loader = StreamLoader(plain, position, cfg.gradient_accumulation_steps)
    return TrainData(position, loader, gens, total)
