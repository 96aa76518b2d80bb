"""Reading the Hugging Face task's data files: plain text, JSONL and Parquet, as documents.

:func:`read_documents` yields a file's documents (or prompt/response examples) for
:mod:`gpu_training.tasks.hf_data` to tokenize. Plain text (``.txt``, ``.md``): a file is one
document, read in chunks cut at line ends. JSONL (``.jsonl``/``.json``, one object a line)
and Parquet (``.parquet``, read with ``pyarrow``): one document per record, from
``text_field``, or one example per record from ``prompt_field`` and ``response_field``. A
record that does not parse or lacks a field is one :class:`~gpu_training.config.ConfigError`
line naming the file and the line or row.

Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "pairs.jsonl"
    >>> _ = path.write_text('{"q": "2+2?", "a": " 4"}\\n')
    >>> list(read_documents(DataSpec((path,), prompt_field="q", response_field="a"), path))
    [('2+2?', ' 4')]
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_training.config import ConfigError

__all__ = ["TEXT_SUFFIXES", "DataSpec", "file_kind", "read_documents"]

TEXT_SUFFIXES = (".txt", ".md", ".text")
_JSON_SUFFIXES = (".jsonl", ".json")
_PARQUET_SUFFIXES = (".parquet",)
_CHUNK_CHARS = 1 << 16  # plain text is tokenized in chunks cut at line ends: bounded memory


@dataclass(frozen=True)
class DataSpec:
    """What to read from the files and how (part of the cache key)."""

    files: tuple[Path, ...]
    """The input files, in order."""

    text_field: str = "text"
    """JSONL/Parquet: the field holding a document's text."""

    prompt_field: str | None = None
    """Instruction data: the field holding the prompt (not scored)."""

    response_field: str | None = None
    """Instruction data: the field holding the response (scored)."""

    @property
    def instruction(self) -> bool:
        """Whether records are prompt/response examples (loss on the responses only)."""
        return self.prompt_field is not None


def file_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return "text"
    if suffix in _JSON_SUFFIXES:
        return "jsonl"
    if suffix in _PARQUET_SUFFIXES:
        return "parquet"
    known = ", ".join((*TEXT_SUFFIXES, *_JSON_SUFFIXES, *_PARQUET_SUFFIXES))
    raise ConfigError(f"data file {path}: unknown type {suffix or '(none)'!r}; expected {known}")


def _text_chunks(path: Path) -> Iterator[str]:
    """A text file in chunks of about ``_CHUNK_CHARS`` characters, each ending at a line end."""
    try:
        with open(path, encoding="utf-8") as f:
            rest = ""
            while True:
                block = f.read(_CHUNK_CHARS)
                if not block:
                    break
                block = rest + block
                cut = block.rfind("\n") + 1
                if cut == 0:  # one very long line: cut anywhere
                    cut = len(block)
                rest = block[cut:]
                yield block[:cut]
            if rest:
                yield rest
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"data file {path}: not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None


def _field(path: Path, where: str, record: Any, name: str) -> str:
    if not isinstance(record, dict):
        raise ConfigError(f"data file {path}: {where} is not an object with fields")
    if name not in record:
        fields = ", ".join(sorted(map(str, record))) or "none"
        raise ConfigError(f"data file {path}: {where} has no field '{name}' (fields: {fields})")
    value = record[name]
    if not isinstance(value, str):
        raise ConfigError(
            f"data file {path}: {where} field '{name}' is {type(value).__name__}, not text"
        )
    return value


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"line {number}", json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(
                    f"data file {path}: line {number} is not JSON ({err.msg}); expected one "
                    "JSON object per line (JSONL)"
                ) from None


def _parquet_records(path: Path, columns: Sequence[str]) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
        names = table.schema_arrow.names
        for column in columns:
            if column not in names:
                raise ConfigError(
                    f"data file {path}: no column '{column}' (columns: {', '.join(names)})"
                )
        row = 0
        for batch in table.iter_batches(columns=list(columns), batch_size=4096):
            for record in batch.to_pylist():
                row += 1
                yield f"row {row}", record
    except (pa.ArrowException, OSError) as err:
        raise ConfigError(f"data file {path}: not a readable Parquet file ({err})") from None


def read_documents(spec: DataSpec, path: Path) -> Iterator[tuple[str, str | None]]:
    """``(text, None)`` per document chunk, or ``(prompt, response)`` per example."""
    kind = file_kind(path)
    if kind == "text":
        if spec.instruction:
            raise ConfigError(
                f"data file {path}: instruction data (prompt_field/response_field) must be "
                "JSONL or Parquet records, not plain text"
            )
        for chunk in _text_chunks(path):
            yield chunk, None
        return
    fields = [spec.prompt_field, spec.response_field] if spec.instruction else [spec.text_field]
    records = (
        _jsonl_records(path)
        if kind == "jsonl"
        else _parquet_records(path, [f for f in fields if f is not None])
    )
    try:
        for where, record in records:
            if spec.instruction:
                assert spec.prompt_field is not None and spec.response_field is not None
                prompt = _field(path, where, record, spec.prompt_field)
                yield prompt, _field(path, where, record, spec.response_field)
            else:
                yield _field(path, where, record, spec.text_field), None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"data file {path}: not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
