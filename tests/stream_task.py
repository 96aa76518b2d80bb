"""Tasks for the streaming tests: the built-in stream reader, with every consumed sample traced.

:func:`recording_task` is the ``charlm`` task on a JSONL stream whose records start with their
id (``"000123 ..."``); a forward pre-hook on the model appends each training micro-batch's ids
to ``record_dir/rank<R>.txt``, one line per micro-batch, in the order the step consumed them.
``restart=True`` is the negative control: a stream that ignores where it was asked to start,
as a resume that restarts the stream from its beginning would. :func:`plain_data` is a
stream without a resume protocol.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
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
    task = resolve_task("charlm", options)
    chars = build_datasets(block_size=options.get("block_size", 16)).tokenizer.chars
    build_model, build_data = task.build_model, task.build_data

    def record(module: nn.Module, args: tuple[Any, ...]) -> None:
        if not module.training:
            return
        rank = os.environ.get("RANK", "0")
        ids = ["".join(chars[int(c)] for c in row[:ID_CHARS]) for row in args[0].detach().cpu()]
        with open(Path(record_dir) / f"rank{rank}.txt", "a") as f:
            f.write(" ".join(str(int(i)) for i in ids) + "\n")

    def model() -> nn.Module:
        built = build_model()
        built.register_forward_pre_hook(record)
        return built

    def data() -> Any:
        train, val = build_data()
        return (_Restarting(train) if restart else train), val

    task.build_model, task.build_data = model, data
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
