"""Iterable datasets that keep their own position: the ``state_dict`` / ``load_state_dict``
convention of torchdata's ``StatefulDataLoader`` (its ``Stateful`` protocol).

A user's ``IterableDataset`` that shards itself by rank and implements::

    state_dict()            # where it is: after the last sample it yielded (plain data)
    load_state_dict(state)  # go there: the next iter() continues from it

resumes exactly at the same world size. At each save every rank's ``state_dict()`` is
gathered into the checkpoint's data position (:class:`StatefulPosition`) as data — numbers,
strings, lists, string-keyed dicts and tensors, loaded back with ``weights_only`` — and on
resume rank ``r`` gets rank ``r``'s back. Another world size is refused in one line: a
per-rank state cannot be resharded without knowing the stream (implement
:class:`~gpu_training.streaming.SampleStream` for that). The dataset is read in the training
process (no DataLoader workers): a worker's copy reads ahead of the step, so its state is
not the step's, and the checkpoint could not see it.

Example:
    >>> check_data_state("Lines", {"next": 3, "files": ["a.jsonl"]})
    >>> check_data_state("Lines", {"reader": open})
    Traceback (most recent call last):
    ...
    gpu_training.config.ConfigError: the training stream Lines: state_dict() holds a value of type builtin_function_or_method at 'reader'; a checkpoint keeps data, not objects: return numbers, strings, lists, dicts with string keys or tensors
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

from gpu_training.config import ConfigError
from gpu_training.ddp import DistributedContext
from gpu_training.process_group import process_group_up
from gpu_training.streaming import StreamPosition

__all__ = [
    "StatefulIterable",
    "StatefulPosition",
    "check_data_state",
    "check_saved_world_size",
    "is_stateful_iterable",
]

_KIND = 2
"""``stream`` in a data position: 1 a global cursor, 2 per-rank states, 0 unknown."""


@runtime_checkable
class StatefulIterable(Protocol):
    """An iterable that saves and restores where it is (torchdata's ``Stateful``)."""

    def state_dict(self) -> dict[str, Any]:
        """Where the iterable is: after the last sample it yielded."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go to ``state``: the next ``iter()`` continues from there."""
        ...


def is_stateful_iterable(obj: object) -> bool:
    """Whether ``obj`` is an iterable (not map-style) dataset with the state protocol."""
    map_style = hasattr(obj, "__getitem__") and hasattr(obj, "__len__")
    protocol = callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )
    return protocol and not map_style and hasattr(obj, "__iter__")


def check_data_state(name: str, state: object, where: str = "") -> None:
    """Refuse a state a checkpoint could not keep as data, naming the key.

    Args:
        name: The dataset (for the message).
        state: What its ``state_dict()`` returned.
        where: The key path so far (recursion).

    Raises:
        ConfigError: At the first value that is not plain data or a tensor.
    """
    if state is None or isinstance(state, (bool, int, float, str, torch.Tensor)):
        return
    if isinstance(state, Mapping):
        for key, value in state.items():
            if not isinstance(key, str):
                _refuse(name, f"the key {key!r}", where or "(top)")
            check_data_state(name, value, f"{where}.{key}" if where else key)
        return
    if isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            check_data_state(name, value, f"{where}[{i}]")
        return
    _refuse(name, f"a value of type {type(state).__name__}", where or "(top)")


def _refuse(name: str, what: str, where: str) -> None:
    raise ConfigError(
        f"the training stream {name}: state_dict() holds {what} at '{where}'; a checkpoint "
        "keeps data, not objects: return numbers, strings, lists, dicts with string keys "
        "or tensors"
    )


def check_saved_world_size(position: object, world_size: int, name: str | None = None) -> None:
    """Refuse a checkpoint's per-rank stream states on another world size, in one line.

    Asked by the ranks as they restore and by ``train``'s checks on the launching host (from
    the checkpoint alone: any other data position passes).

    Args:
        position: The checkpoint's data position (``sampler_state``), whatever it holds.
        world_size: The data-parallel ranks of the run that would resume.
        name: The dataset (default: the name the checkpoint recorded).

    Raises:
        ConfigError: If ``position`` holds per-rank states of another world size.
    """
    if not isinstance(position, Mapping) or position.get("stream") != _KIND:
        return
    saved = position.get("world_size")
    if not isinstance(saved, int) or isinstance(saved, bool):  # a damaged or foreign position
        raise ConfigError(
            "cannot resume: the checkpoint's data position holds per-rank stream states without "
            f"the world size that saved them (world_size={saved!r}); use another checkpoint.dir"
        )
    if saved == world_size:
        return
    name = name or str(position.get("name") or "the training stream")
    raise ConfigError(
        f"cannot resume: the checkpoint holds {name}'s own state on each of "
        f"{saved} ranks and this run has {world_size}; a stream's per-rank "
        f"state cannot be resharded without knowing the stream: resume on {saved} "
        "ranks, implement records(start)/decode(record) "
        "(docs/checkpointing.md#streaming-data), or use another checkpoint.dir"
    )


def _gather(ctx: DistributedContext, state: dict[str, Any]) -> list[Any]:
    """Every rank's state, on every rank (a collective)."""
    if not (ctx.is_distributed and process_group_up()):
        return [state]
    states: list[Any] = [None] * ctx.world_size
    # between this job's own ranks, already checked to be plain data (never read from disk)
    dist.all_gather_object(states, state)
    return states


class StatefulPosition(StreamPosition):
    """The data position of a :class:`StatefulIterable`: the steps done, every rank's state.

    Counts epochs and global steps as a stream's cursor does (the random streams key on
    them); its ``state_dict`` is a collective (every rank calls it when the run saves).

    Args:
        dataset: This rank's iterable.
        ctx: This rank and the world size.
        global_batch_size: Samples per optimizer step over all ranks.
    """

    def __init__(self, dataset: Any, ctx: DistributedContext, global_batch_size: int) -> None:
        super().__init__(global_batch_size)
        self.dataset, self.ctx = dataset, ctx
        self.name = type(dataset).__name__

    def own_state(self) -> dict[str, Any]:
        """This rank's dataset state, checked to be data.

        Raises:
            ConfigError: Naming the dataset and the key that is not data.
        """
        state = self.dataset.state_dict()
        if not isinstance(state, Mapping):
            _refuse(self.name, f"a value of type {type(state).__name__}", "(top)")
        check_data_state(self.name, state)
        return dict(state)

    def state_dict(self) -> dict[str, Any]:
        """The cursor's fields plus ``world_size``, ``ranks`` (one state per rank), ``name``."""
        ranks = _gather(self.ctx, self.own_state())
        cursor = super().state_dict()
        return {
            **cursor,
            "stream": _KIND,
            "world_size": self.ctx.world_size,
            "ranks": ranks,
            "name": self.name,  # for a refusal on the launching host, which has no dataset
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Rank ``r`` continues from rank ``r``'s saved state (the same world size only).

        Raises:
            ConfigError: A position of another kind, or saved at another world size.
        """
        if state.get("stream") != _KIND:
            raise ConfigError(
                f"cannot resume: the training data is {self.name}, a stream that keeps its own "
                "state, but the checkpoint's data position is not such a stream's: resume it "
                "with the data it was written with, or use another checkpoint.dir"
            )
        check_saved_world_size(state, self.ctx.world_size, self.name)
        super().load_state_dict({**state, "stream": 1})
        self.dataset.load_state_dict(state["ranks"][self.ctx.rank])
