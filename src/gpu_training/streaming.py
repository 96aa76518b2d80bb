"""Streaming data that resumes exactly: one global sample cursor the toolkit owns.

A stream is read as *one global sequence of samples*, the same on every rank. Global step
``k`` consumes samples ``[k·G, (k+1)·G)`` (``G`` the global batch), split over ranks and
micro-steps exactly as :class:`~gpu_training.data.GlobalBatchSampler` splits indices: rank
``r``'s micro-step ``a`` holds samples ``k·G + (r·A + a)·B … + B``. What a checkpoint keeps
is the epoch and the global steps done in it (:class:`StreamPosition`): one integer cursor,
free of world size and per-device batch, so any world size resumes at the same sample.

The protocol a stream implements (:class:`SampleStream`)::

    records(start)   # the raw records from global index `start` on: cheap to read and skip
    decode(record)   # one record into a sample (parse, tokenize): only for this rank's own

Each rank reads every record of a step but decodes only its own, and DataLoader worker
``w`` of ``n`` decodes and collates only this rank's micro-batches ``j ≡ w (mod n)``; the
DataLoader takes them from its workers round-robin, so the order that reaches the step is
the same for any worker count. A step is yielded only once all its ``G`` records were read,
so every rank agrees where a finite stream ends (the partial step is dropped; the next
epoch reads the stream again from its start).

A plain ``IterableDataset`` (no ``records``/``decode``) trains as the user shards it, but a
run asked to resume from it is refused: nothing says where it was (:class:`NoPosition`).

Example:
    >>> stream = RangeStream(10)
    >>> position = StreamPosition(global_batch_size=4)
    >>> rank1 = RankStream(stream, position, rank=1, world_size=2, per_device_batch_size=1,
    ...                    accumulation=2, collate=list)
    >>> [batch for batch in rank1]  # samples 2, 3 of step 0; 6, 7 of step 1; 8, 9 dropped
    [[2], [3], [6], [7]]
    >>> position.load_state_dict({**position.state_dict(), "position": 1})
    >>> [batch for batch in rank1]
    [[6], [7]]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from typing import Any, Protocol, runtime_checkable

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from gpu_training.config import ConfigError

__all__ = [
    "NoPosition",
    "RangeStream",
    "RankStream",
    "SampleStream",
    "StreamLoader",
    "StreamPosition",
    "is_sample_stream",
]


@runtime_checkable
class SampleStream(Protocol):
    """A global sequence of samples that can be reopened at any global index."""

    def records(self, start: int) -> Iterator[Any]:
        """The raw records from global index ``start`` on, the same on every rank."""
        ...

    def decode(self, record: Any) -> Any:
        """One record as a training sample (e.g. ``(inputs, targets)``)."""
        ...


def is_sample_stream(obj: object) -> bool:
    """Whether ``obj`` implements :class:`SampleStream` (``records`` and ``decode``)."""
    return callable(getattr(obj, "records", None)) and callable(getattr(obj, "decode", None))


class RangeStream:
    """The integers ``0 … n-1`` as a stream (tests and examples: a sample is its own id)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def records(self, start: int) -> Iterator[int]:
        """Integers from ``start`` to ``n - 1``."""
        return iter(range(start, self.n))

    def decode(self, record: int) -> int:
        """The record itself."""
        return record


class StreamPosition:
    """Where a stream run is: the epoch and the global steps done in it (the cursor).

    The global sample cursor is ``position × global_batch_size``; nothing here depends on
    the world size. It plays the sampler's part for the Trainer and :mod:`gpu_training.resume`
    (``epoch``, ``set_epoch``, ``state_dict``, ``load_state_dict``).

    Args:
        global_batch_size: Samples per optimizer step over all ranks (``G``).
    """

    def __init__(self, global_batch_size: int) -> None:
        self.global_batch_size = global_batch_size
        self.epoch = 0
        self.position = 0
        self._replay = False  # a pass ran to the stream's end: the next iter starts over

    @property
    def cursor(self) -> int:
        """Global samples of the current epoch already consumed."""
        return self.position * self.global_batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select an epoch (a new one starts at position 0; the same one keeps it)."""
        if epoch != self.epoch:
            self.epoch, self.position, self._replay = epoch, 0, False

    def begin(self) -> int:
        """The global step the next pass starts at (0 again after a full pass)."""
        if self._replay:
            self.position, self._replay = 0, False
        return self.position

    def advance(self, position: int) -> None:
        """Count ``position`` global steps of this epoch as done."""
        self.position = position

    def finish(self) -> None:
        """The pass reached the end of the stream."""
        self._replay = True

    def state_dict(self) -> dict[str, Any]:
        """Plain ints: ``epoch``, ``position`` (global steps), ``cursor`` (samples), ``G``."""
        return {
            "stream": 1,
            "epoch": self.epoch,
            "position": self.position,
            "cursor": self.cursor,
            "global_batch_size": self.global_batch_size,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the saved cursor (any world size, same global batch).

        Raises:
            ConfigError: If the state is not a stream's, or its global batch differs.
        """
        if "stream" not in state:
            raise ConfigError(
                "the checkpoint's data position is a map-style sampler's, but this job reads "
                "a stream: resume it with the data it was written with, or use another "
                "checkpoint.dir"
            )
        if state["stream"] != 1:  # 0: a stream without a protocol; 2: per-rank states
            raise ConfigError(
                "cannot resume: the checkpoint's data position is another kind of stream's "
                f"(kind {state['stream']}), not a global cursor: resume it with the data it "
                "was written with, or use another checkpoint.dir"
            )
        if int(state["global_batch_size"]) != self.global_batch_size:
            raise ConfigError(
                f"field 'training.global_batch_size': the checkpoint's stream cursor counts "
                f"global batches of {int(state['global_batch_size'])}, this job's are "
                f"{self.global_batch_size}"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._replay = False


class NoPosition:
    """The position of a stream without a resume protocol: saved as unknown, never restored.

    Args:
        name: What the stream is (``type(dataset).__name__``), for the refusal.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Remember the epoch (the stream itself decides what an epoch reads)."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """A marker: this checkpoint cannot place the stream (named, for the refusal)."""
        return {"stream": 0, "epoch": self.epoch, "name": self.name}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Always refuses: one line naming the cause.

        Raises:
            ConfigError: Always (the stream has no ``records``/``decode`` to reopen it).
        """
        raise ConfigError(
            f"cannot resume: the training data is a stream without a resume protocol "
            f"({self.name} has no records(start)/decode(record)), so where it stopped is "
            "unknown; implement them (docs/checkpointing.md#streaming-data), set "
            "checkpoint.resume: false, or use another checkpoint.dir"
        )


class RankStream(IterableDataset[Any]):
    """This rank's micro-batches of a :class:`SampleStream`, from the position's cursor.

    With DataLoader workers each takes this rank's micro-batches ``j ≡ worker (mod n)``
    (``j`` counted from where the pass starts); use it with ``batch_size=None``.

    Args:
        stream: The global sequence.
        position: Where the pass starts (read when the iteration starts).
        rank: This rank.
        world_size: Ranks the global batch is split across.
        per_device_batch_size: Samples per micro-batch (``B``).
        accumulation: Micro-batches per global step on a rank (``A``).
        collate: Makes a micro-batch from ``B`` samples.
    """

    def __init__(
        self,
        stream: SampleStream,
        position: StreamPosition,
        *,
        rank: int,
        world_size: int,
        per_device_batch_size: int,
        accumulation: int,
        collate: Callable[[list[Any]], Any],
    ) -> None:
        self.stream, self.position, self.collate = stream, position, collate
        self.rank, self.world_size = rank, world_size
        self.batch, self.accumulation = per_device_batch_size, accumulation

    def __iter__(self) -> Iterator[Any]:
        """This rank's (and this worker's) micro-batches, step by step."""
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        b, a = self.batch, self.accumulation
        g = self.world_size * a * b
        records = self.stream.records(self.position.position * g)
        micro = 0  # this rank's micro-batches since the pass started
        while True:
            # The whole step first: every rank then agrees whether it is complete.
            step = list(islice(records, g))
            if len(step) < g:
                return
            mine = step[self.rank * a * b : (self.rank + 1) * a * b]
            for m in range(a):
                if micro % workers == worker:
                    chunk = mine[m * b : (m + 1) * b]
                    yield self.collate([self.stream.decode(r) for r in chunk])
                micro += 1


def _last_line(message: str) -> str:
    """The error's own line: a DataLoader worker wraps it in its traceback, last."""
    lines = [line for line in message.splitlines() if line.strip()]
    if len(lines) < 2:
        return message
    prefix, sep, rest = lines[-1].partition(": ")
    return rest if sep and prefix.endswith("Error") else lines[-1]


class StreamLoader:
    """Iterates a DataLoader over a stream and moves its position as steps are consumed.

    The position counts a step when its last micro-batch reaches the caller (not when a
    worker fetched it ahead), so a save after a step keeps the exact cursor.

    Args:
        loader: A DataLoader over a :class:`RankStream` (or the user's iterable).
        position: The cursor (None: nothing to move).
        accumulation: Micro-batches per global step on this rank.
    """

    def __init__(
        self, loader: DataLoader[Any], position: StreamPosition | None, accumulation: int
    ) -> None:
        self.loader, self.position, self.accumulation = loader, position, accumulation

    @property
    def sampler(self) -> StreamPosition | None:
        """The position, where ``train_one_epoch`` looks for ``set_epoch``."""
        return self.position

    def __iter__(self) -> Iterator[Any]:
        """The micro-batches of the rest of the epoch."""
        position = self.position
        start = 0 if position is None else position.begin()
        seen = 0
        try:
            for seen, batch in enumerate(self.loader, 1):
                if position is not None and seen % self.accumulation == 0:
                    # Counted before the step's last micro-batch is yielded: the caller saves
                    # after training on it without asking for another batch.
                    position.advance(start + seen // self.accumulation)
                yield batch
        except ConfigError as err:  # a bad record, maybe wrapped by a worker: one line again
            raise ConfigError(_last_line(str(err))) from None
        if start == 0 and seen == 0:  # an epoch without a step would loop forever
            raise ConfigError(
                "field 'training.global_batch_size': the training stream holds no global "
                "batch: lower training.global_batch_size",
                "training.global_batch_size",
            )
        if position is not None:
            position.finish()
