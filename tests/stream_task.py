"""Tasks for the streaming tests: the built-in stream reader, with every consumed sample traced.

:func:`recording_task` is the ``charlm`` task on a JSONL stream whose records start with their
id (``"000123 ..."``); a forward pre-hook on the model appends each training micro-batch's ids
to ``record_dir/rank<R>.txt``, one line per micro-batch, in the order the step consumed them.
``restart=True`` is the negative control: a stream that ignores where it was asked to start,
as a resume that restarts the stream from its beginning would; :func:`hf_recording_task` is the
same for ``task: hf``. :func:`stateful_task` reads
the same stream through a torchdata-style stateful iterable (:class:`StatefulLines`).
:func:`plain_data` is a stream without a resume protocol.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import IterableDataset

from gpu_training.tasks import Task, resolve_task
from gpu_training.tasks.charlm import CharLMConfig, CharTransformer, build_datasets

ID_CHARS = 6


def write_stream(path: Path, n: int) -> Path:
    """``n`` JSONL records: ``{"id": i, "text": "<i, 6 digits> <text of various lengths>"}``."""
    words = "In the beginning God created the heaven and the earth. And the earth was"
    with open(path, "w") as f:
        for i in range(n):
            text = f"{i:0{ID_CHARS}d} " + words[: 5 + (i * 7) % 40]
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    return path


class _Restarting:
    """The negative control: reads the stream from its start whatever ``start`` is."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def records(self, start: int) -> Iterator[Any]:
        return self.stream.records(0)

    def decode(self, record: Any) -> Any:
        return self.stream.decode(record)


def recording_task(record_dir: str, restart: bool = False, **options: Any) -> Task:
    """The charlm task on ``options['stream']``, tracing the ids each rank trains on."""
    task = _traced(resolve_task("charlm", options), record_dir, options.get("block_size", 16))
    build_data = task.build_data

    def data() -> Any:
        train, val = build_data()
        return (_Restarting(train) if restart else train), val

    task.build_data = data
    return task


def hf_recording_task(record_dir: str, restart: bool = False, **options: Any) -> Task:
    """``task: hf`` on ``options['stream']``, tracing the record ids each rank trains on
    (the window's first tokens, decoded with the task's tokenizer)."""
    from transformers import AutoTokenizer

    task = resolve_task("hf", options)
    tokenizer = AutoTokenizer.from_pretrained(options["tokenizer"])
    build_model, build_data = task.build_model, task.build_data

    def record(module: nn.Module, args: tuple[Any, ...]) -> None:
        if module.training:
            rows = [tokenizer.decode(row[: 2 * ID_CHARS]) for row in args[0].tolist()]
            _append(record_dir, [row[:ID_CHARS] for row in rows])

    def model() -> nn.Module:
        built = build_model()
        built.register_forward_pre_hook(record)
        return built

    def data() -> Any:
        train, val = build_data()
        return (_Restarting(train) if restart else train), val

    task.build_model, task.build_data = model, data
    return task


def _append(record_dir: str, ids: list[str]) -> None:
    """One micro-batch's ids, a line of ``record_dir/rank<R>.txt``."""
    rank = os.environ.get("RANK", "0")
    with open(Path(record_dir) / f"rank{rank}.txt", "a") as f:
        f.write(" ".join(str(int(i)) for i in ids) + "\n")


class StatefulLines(IterableDataset[Any]):
    """This rank's share of a stream (record ``i`` on rank ``i % world``) that keeps its own
    position, torchdata's way: ``state_dict`` / ``load_state_dict``, no ``records``/``decode``.

    ``forget`` is the negative control (a state never restored); ``bad_state`` puts an object
    in the state.
    """

    def __init__(self, stream: Any, *, forget: bool = False, bad_state: bool = False) -> None:
        self.stream, self.forget, self.bad_state = stream, forget, bad_state
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.next = 0  # this rank's records yielded in the current pass

    def __iter__(self) -> Iterator[Any]:
        records = self.stream.records(self.rank + self.next * self.world)
        for i, record in enumerate(records):
            if i % self.world == 0:
                self.next += 1  # counted before the yield: the state is after this sample
                yield self.stream.decode(record)
        self.next = 0  # the next pass reads the stream from its start

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"next": self.next, "world": self.world}
        if self.bad_state:
            state["reader"] = {"stream": self.stream}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.forget:
            self.next = int(state["next"])


def stateful_task(
    record_dir: str, forget: bool = False, bad_state: bool = False, **options: Any
) -> Task:
    """The charlm task on ``options['stream']`` read through :class:`StatefulLines`, traced."""
    task = _traced(resolve_task("charlm", options), record_dir, options.get("block_size", 16))
    build_data = task.build_data

    def data() -> Any:
        train, val = build_data()
        return StatefulLines(train, forget=forget, bad_state=bad_state), val

    task.build_data = data
    return task


def _traced(task: Task, record_dir: str, block_size: int) -> Task:
    """``task`` with each training micro-batch's ids appended to ``record_dir/rank<R>.txt``."""
    chars = build_datasets(block_size=block_size).tokenizer.chars
    build_model = task.build_model

    def record(module: nn.Module, args: tuple[Any, ...]) -> None:
        if not module.training:
            return
        ids = ["".join(chars[int(c)] for c in row[:ID_CHARS]) for row in args[0].detach().cpu()]
        _append(record_dir, ids)

    def model() -> nn.Module:
        built = build_model()
        built.register_forward_pre_hook(record)
        return built

    task.build_model = model
    return task


def read_steps(record_dir: Path, world_size: int, accumulation: int) -> list[list[list[int]]]:
    """Per step, per rank, the ordered ids the rank trained on."""
    per_rank = []
    for rank in range(world_size):
        lines = (record_dir / f"rank{rank}.txt").read_text().split("\n")
        micro = [[int(x) for x in line.split()] for line in lines if line.strip()]
        steps = [
            [x for m in micro[i : i + accumulation] for x in m]
            for i in range(0, len(micro), accumulation)
        ]
        per_rank.append(steps)
    assert len({len(s) for s in per_rank}) == 1, "ranks trained a different number of steps"
    return [list(step) for step in zip(*per_rank, strict=True)]


class _Plain(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Windows of the corpus as a stream without ``records``/``decode``."""

    def __init__(self) -> None:
        self.base = build_datasets(block_size=16).train

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (self.base[i] for i in range(len(self.base)))


def plain_data() -> Any:
    """A training stream the toolkit cannot place: it trains, but cannot resume."""
    return _Plain(), None


_VOCAB = build_datasets(block_size=16).tokenizer.vocab_size  # at import: not under meta


def plain_model() -> nn.Module:
    """A small character transformer for :func:`plain_data`."""
    return CharTransformer(CharLMConfig(block_size=16, n_layer=1, n_head=2, n_embd=16), _VOCAB)


def stream_job(
    tmp: Path,
    out: Path,
    stream: Path,
    task: str,
    *,
    global_batch: int,
    per_device: int,
    steps: int,
    **options: Any,
) -> Path:
    """The tests' streamed job file (a checkpoint every 3 steps, DDP): the tiny transformer
    reading ``stream`` through ``task`` (one of this module's)."""
    import yaml

    job = {
        "task": f"stream_task:{task}",
        "task_options": {
            "record_dir": str(tmp / "ids_live"),  # one path for every run: not a math change
            "stream": str(stream),
            "block_size": 16,
            "n_layer": 1,
            "n_head": 2,
            "n_embd": 16,
            "bias": False,
            **options,
        },
        "training": {
            "global_batch_size": global_batch,
            "per_device_batch_size": per_device,
            "learning_rate": 3e-3,
            "warmup_steps": 1,
            "max_steps": steps,
            "precision": "fp32",
            "seed": 5,
        },
        "strategy": {"name": "ddp"},
        "checkpoint": {"every": 3, "keep_last_n": 5},
        "run": {
            "output_dir": str(out),
            "log_every": 1,
            "eval_every": 100,
            "eval_batches": 1,
            "plot": False,
            "tensorboard": False,
            "progress": False,
        },
    }
    path = tmp / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def simulated_steps(
    stream: Any,
    world: int,
    workers: int,
    steps: int,
    state: Any = None,
    *,
    global_batch: int,
    per_device: int,
    ids: Callable[[Any], list[int]],
) -> tuple[list[list[list[int]]], Any]:
    """``steps`` global steps of ``stream`` on ``world`` simulated ranks (one process).

    Returns, per step, per rank, the sample ids ``ids(batch)`` reads off each micro-batch,
    and the data position the last rank would save. ``state``: a position to resume from.
    """
    from gpu_training.config import TrainingConfig
    from gpu_training.ddp import DistributedContext
    from gpu_training.train_data import build_train_data

    cfg = TrainingConfig(
        global_batch_size=global_batch, per_device_batch_size=per_device, max_steps=99
    ).for_world_size(world)
    per_rank, saved = [], None
    for rank in range(world):
        ctx = DistributedContext(
            rank=rank, local_rank=rank, world_size=world, local_world_size=world
        )
        data = build_train_data(stream, cfg, ctx, workers=workers)
        if state is not None:
            data.position.load_state_dict(state)
        batches = iter(data.loader)
        accum = cfg.gradient_accumulation_steps
        mine = [[i for _ in range(accum) for i in ids(next(batches))] for _ in range(steps)]
        del batches  # stop the workers
        per_rank.append(mine)
        saved = data.position.state_dict()
    return [list(s) for s in zip(*per_rank, strict=True)], saved


def flat(step: list[list[int]]) -> list[int]:
    """One step's ids, rank after rank."""
    return [i for rank in step for i in rank]
