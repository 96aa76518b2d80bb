"""Streams over local files, read lazily and tokenized on the fly (:mod:`gpu_training.streaming`).

:class:`FileStream` reads JSONL (one record a line, the text in ``text_field``), plain text
(one record a line) and Parquet (one record a row) in file order; :class:`HFStream` reads the
same files through Hugging Face ``datasets`` (``load_dataset(..., streaming=True)``). Both
are :class:`~gpu_training.streaming.SampleStream`\\ s: ``records(start)`` reopens the
global sequence at any index and yields raw records (bytes of a line, a row's text),
``decode`` parses and tokenizes one (only this rank's own are decoded).

Costs of a skip: to reopen at ``start``, :class:`FileStream` skips whole files by their
record count (a newline count over the bytes, or Parquet's row-group metadata) and whole
row groups, then reads past the remaining lines undecoded; :class:`HFStream` reads and
drops ``start`` records (``IterableDataset.skip``).

Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.jsonl"
    >>> _ = path.write_text('{"text": "ab"}\\n{"text": "cd"}\\n{"text": "ef"}\\n')
    >>> stream = FileStream((path,), encode=str.upper)
    >>> [stream.decode(r) for r in stream.records(1)]
    ['CD', 'EF']
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gpu_training.config import ConfigError
from gpu_training.tasks.chardata import CharTokenizer
from gpu_training.tasks.hf_files import file_kind
from gpu_training.tasks.losses import IGNORE_INDEX

__all__ = ["FileStream", "HFStream", "char_stream", "open_stream", "stream_files"]

_COUNT_CHUNK = 1 << 20


def stream_files(path: str | Path) -> tuple[Path, ...]:
    """A stream's files: ``path`` itself, or a directory's readable files in name order.

    Raises:
        ConfigError: If the path does not exist or a directory holds no data file.
    """
    root = Path(path)
    if root.is_file():
        file_kind(root)  # an unknown suffix: one line naming it
        return (root,)
    if not root.is_dir():
        raise ConfigError(f"stream {root}: no such file or directory")
    files = []
    for child in sorted(root.iterdir()):
        try:
            file_kind(child)
        except ConfigError:
            continue
        files.append(child)
    if not files:
        raise ConfigError(f"stream {root}: no .jsonl, .txt or .parquet file in the directory")
    return tuple(files)


def _count_lines(path: Path) -> int:
    """Records in a line file: newlines, plus an unterminated last line."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(_COUNT_CHUNK):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


class FileStream:
    """JSONL, text and Parquet files as one global sequence of records.

    Args:
        files: The files, in order (:func:`stream_files`).
        encode: A record's text into a sample (e.g. tokenize and cut to the context).
        text_field: JSONL and Parquet: the field holding the text.
    """

    def __init__(
        self,
        files: Sequence[Path],
        *,
        encode: Callable[[str], Any],
        text_field: str = "text",
    ) -> None:
        self.files = tuple(Path(f) for f in files)
        self.kinds = tuple(file_kind(f) for f in self.files)
        self.encode, self.text_field = encode, text_field

    def records(self, start: int) -> Iterator[Any]:
        """Raw records from global index ``start``: ``(kind, line bytes or row text, where)``."""
        for path, kind in zip(self.files, self.kinds, strict=True):
            if kind == "parquet":
                start = yield from self._parquet(path, start)
                continue
            if start and start >= (count := _count_lines(path)):  # skip the whole file
                start -= count
                continue
            with open(path, "rb") as f:
                for number, line in enumerate(f, 1):
                    if number > start:
                        yield kind, line, (path, number)
            start = 0

    def _parquet(self, path: Path, start: int) -> Generator[Any, None, int]:
        """A Parquet file's rows from ``start``; returns what is left of ``start`` after it."""
        import pyarrow.parquet as pq  # only when a Parquet file is read

        handle = pq.ParquetFile(path)
        for group in range(handle.metadata.num_row_groups):
            rows = handle.metadata.row_group(group).num_rows
            if start >= rows:  # skipped by its metadata: never read
                start -= rows
                continue
            table = handle.read_row_group(group, columns=[self.text_field])
            for row, text in enumerate(table.column(0).to_pylist()[start:], start):
                yield "parquet", text, (path, row)
            start = 0
        return start

    def decode(self, record: Any) -> Any:
        """Parse one record and ``encode`` its text.

        Raises:
            ConfigError: A line that is not JSON or lacks the text field (file and line).
        """
        kind, raw, (path, where) = record
        if kind == "text":
            return self.encode(raw.decode("utf-8").rstrip("\r\n"))
        if kind == "parquet":
            return self.encode("" if raw is None else str(raw))
        if not raw.strip():
            return self.encode("")
        try:
            value = json.loads(raw)
        except ValueError as err:
            raise ConfigError(f"stream {path}, line {where}: not JSON ({err})") from None
        if not isinstance(value, dict) or self.text_field not in value:
            raise ConfigError(f"stream {path}, line {where}: no field {self.text_field!r}")
        return self.encode(str(value[self.text_field]))


class HFStream:
    """Local files through Hugging Face ``datasets`` streaming, as a sample stream.

    Args:
        files: JSONL, text or Parquet files, all of one kind.
        encode: A record's text into a sample.
        text_field: The field holding the text (``text`` for plain text files).
    """

    def __init__(
        self, files: Sequence[Path], *, encode: Callable[[str], Any], text_field: str = "text"
    ) -> None:
        if importlib.util.find_spec("datasets") is None:  # before any process starts
            raise ConfigError(
                "stream_reader 'hf' needs Hugging Face datasets: pip install datasets"
            )
        kinds = {file_kind(Path(f)) for f in files}
        if len(kinds) != 1:
            raise ConfigError(f"stream through datasets: files of one kind, got {sorted(kinds)}")
        builder = {"jsonl": "json", "text": "text", "parquet": "parquet"}[kinds.pop()]
        self.files, self.builder = [str(f) for f in files], builder
        self.encode, self.text_field = encode, text_field

    def _dataset(self) -> Any:
        import datasets  # optional: only this reader needs it

        return datasets.load_dataset(
            self.builder, data_files=self.files, split="train", streaming=True
        )

    def records(self, start: int) -> Iterator[Any]:
        """Rows from ``start`` on (``skip`` reads and drops the ones before)."""
        data = self._dataset()
        if start:
            data = data.skip(start)
        # iter(batch_size), not __iter__: inside a DataLoader worker __iter__ would read only
        # that worker's files, and the global order would depend on the worker count.
        for batch in data.iter(batch_size=256):
            yield from batch[self.text_field]

    def decode(self, record: Any) -> Any:
        """``encode`` the row's text."""
        return self.encode("" if record is None else str(record))


class _CharWindow:
    """A record's text as one ``(inputs, targets)`` window of the character model.

    Characters outside the vocabulary are dropped; a short text is padded, its padding not
    scored (``IGNORE_INDEX``). A class, not a closure: DataLoader workers pickle it.
    """

    def __init__(self, tokenizer: CharTokenizer, block_size: int) -> None:
        self.tokenizer, self.block_size = tokenizer, block_size
        self.known = frozenset(tokenizer.chars)

    def __call__(self, text: str) -> tuple[Tensor, Tensor]:
        kept = "".join(c for c in text[: 4 * (self.block_size + 1)] if c in self.known)
        ids = self.tokenizer.encode(kept[: self.block_size + 1])
        inputs = torch.zeros(self.block_size, dtype=torch.long)
        targets = torch.full((self.block_size,), IGNORE_INDEX, dtype=torch.long)
        n = max(len(ids) - 1, 0)
        inputs[: len(ids[:-1])] = ids[:-1]
        targets[:n] = ids[1:]
        return inputs, targets


def open_stream(
    path: str, encode: Callable[[str], Any], *, reader: str, text_field: str
) -> FileStream | HFStream:
    """A task's training stream over ``path``: one sample per record, ``encode``-d on the fly.

    Args:
        path: A file or a directory of files (:func:`stream_files`).
        encode: A record's text into a sample (picklable: DataLoader workers get a copy).
        reader: ``files`` (:class:`FileStream`) or ``hf`` (:class:`HFStream`).
        text_field: JSONL/Parquet: the field holding the text.

    Raises:
        ConfigError: If the path holds no data file (or ``hf`` lacks ``datasets``).
    """
    kind = HFStream if reader == "hf" else FileStream
    return kind(stream_files(path), encode=encode, text_field=text_field)


def char_stream(
    path: str, tokenizer: CharTokenizer, block_size: int, *, reader: str, text_field: str
) -> FileStream | HFStream:
    """The built-in task's training stream: one window of ``block_size`` per record.

    Args:
        path: A file or a directory of files (:func:`stream_files`).
        tokenizer: The character vocabulary.
        block_size: Characters per sample.
        reader: ``files`` (:class:`FileStream`) or ``hf`` (:class:`HFStream`).
        text_field: JSONL/Parquet: the field holding the text.

    Raises:
        ConfigError: If the path holds no data file.
    """
    encode = _CharWindow(tokenizer, block_size)
    return open_stream(path, encode, reader=reader, text_field=text_field)
