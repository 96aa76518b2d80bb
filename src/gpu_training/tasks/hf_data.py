"""Text files to packed token windows, tokenized once into a memory-mapped cache.

The data side of the Hugging Face task (:mod:`gpu_training.tasks.hf`)::

    files (.txt, .jsonl, .parquet) ──tokenizer──▶ cache/<key>/tokens.bin (+ mask.bin)
                                                 ──▶ PackedWindows: (inputs, targets) of T tokens

* **Reading.** Plain text (``.txt``, ``.md``): a file is one document, read in chunks cut at
  line ends. JSONL (``.jsonl``/``.json``, one object a line) and Parquet (``.parquet``, read
  with ``pyarrow``): one document per record, from ``text_field`` — or, for instruction data,
  one example per record from ``prompt_field`` and ``response_field``.
* **Tokenizing.** With the model's tokenizer (local files), without special tokens; each
  document ends with the EOS token (and starts with BOS when the tokenizer has a distinct
  one). Instruction examples are ``prompt + response + EOS`` and only the response and EOS
  are scored: the other targets are -100.
* **Caching.** The token ids go to ``tokens.bin`` (``uint16`` or ``uint32``), the scored
  mask of instruction data to ``mask.bin``, and ``meta.json`` is written last: a directory
  without it does not exist. The directory's name is a hash of the tokenizer's files, the
  input files' contents and the reading options, so a second run (or a restart) reads the
  cache instead of tokenizing, and a changed file or tokenizer is tokenized anew. One
  process tokenizes: the others wait on a file lock and then read what it wrote.
* **Packing.** The stream is cut into windows of ``block_size + 1`` tokens at a stride of
  ``block_size`` (inputs ``w[:-1]``, targets ``w[1:]``); windows cross document boundaries.

Example:
    >>> import numpy as np
    >>> windows = PackedWindows.from_arrays(np.arange(10, dtype=np.uint16), None, block_size=4)
    >>> len(windows), [t.tolist() for t in windows[1]]
    (2, [[4, 5, 6, 7], [5, 6, 7, 8]])
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash
from torch import Tensor
from torch.utils.data import Dataset

from gpu_training.config import ConfigError
from gpu_training.tasks.hf_files import TEXT_SUFFIXES, DataSpec, file_kind, read_documents

__all__ = [
    "CACHE_VERSION",
    "TEXT_SUFFIXES",
    "DataSpec",
    "PackedWindows",
    "TokenCache",
    "build_datasets",
    "prepare_tokens",
    "tokenizer_files",
    "tokenizer_fingerprint",
]

CACHE_VERSION = 1
"""Bumped when the cache layout or the tokenization rules change (old caches are ignored)."""

_BATCH = 256  # chunks or records per tokenizer call (the Rust side runs a batch in parallel)
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
)


@dataclass(frozen=True)
class TokenCache:
    """A committed cache directory: the token stream and, for instruction data, its mask."""

    directory: Path
    num_tokens: int
    num_documents: int
    dtype: str
    has_mask: bool
    built: bool
    """True if this call tokenized the files, False if it found the cache."""
    seconds: float
    """Time spent in :func:`prepare_tokens` (hashing, and tokenizing if ``built``)."""

    def tokens(self) -> np.ndarray:
        """The token ids, memory-mapped (read-only)."""
        return np.memmap(self.directory / "tokens.bin", dtype=self.dtype, mode="r")

    def mask(self) -> np.ndarray | None:
        """1 where a token is a scored target, memory-mapped; None when every token is."""
        if not self.has_mask:
            return None
        return np.memmap(self.directory / "mask.bin", dtype=np.uint8, mode="r")


# --- the cache key ------------------------------------------------------------------------------


def _hash_file(path: Path, into: Any) -> None:
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            into.update(block)


def tokenizer_files(directory: Path) -> list[Path]:
    """The files of a tokenizer directory that decide its ids (what ``save_pretrained`` writes)."""
    return [directory / name for name in _TOKENIZER_FILES if (directory / name).is_file()]


def tokenizer_fingerprint(tokenizer: Any, directory: Path | None) -> str:
    """A hash of what decides the token ids: the tokenizer's files (or its serialization).

    Args:
        tokenizer: A Hugging Face tokenizer.
        directory: Where it was loaded from (its files are hashed); None hashes the fast
            tokenizer's serialization and special tokens instead.
    """
    digest = xxhash.xxh3_128()
    digest.update(type(tokenizer).__name__.encode())
    found = tokenizer_files(directory) if directory is not None else []
    if found:
        for path in found:
            digest.update(path.name.encode())
            _hash_file(path, digest)
    else:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        digest.update((backend.to_str() if backend is not None else repr(tokenizer)).encode())
    digest.update(repr((tokenizer.bos_token_id, tokenizer.eos_token_id, len(tokenizer))).encode())
    return digest.hexdigest()


def _cache_key(spec: DataSpec, tokenizer_hash: str) -> str:
    digest = xxhash.xxh3_128()
    fields = (spec.text_field, spec.prompt_field, spec.response_field)
    digest.update(json.dumps([CACHE_VERSION, tokenizer_hash, fields]).encode())
    for path in spec.files:  # contents, not names or times: a copied file hits the cache
        digest.update(str(path.stat().st_size).encode())
        _hash_file(path, digest)
    return digest.hexdigest()


# --- tokenizing -------------------------------------------------------------------------------


def _batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return list(tokenizer(texts, add_special_tokens=False)["input_ids"])


def _write_stream(
    spec: DataSpec, tokenizer: Any, dtype: np.dtype[Any], tmp: Path
) -> tuple[int, int]:
    """Tokenizes every file into ``tmp``; returns ``(tokens, documents)``."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError(
            "the tokenizer has no EOS token: documents could not be separated; use a "
            "tokenizer with an eos_token"
        )
    bos = tokenizer.bos_token_id
    start = [bos] if bos is not None and bos != eos else []
    total = documents = 0
    with open(tmp / "tokens.bin", "wb") as tok_f, contextlib.ExitStack() as stack:
        mask_f = stack.enter_context(open(tmp / "mask.bin", "wb")) if spec.instruction else None

        def emit(ids: list[int], scored: list[int] | None = None) -> None:
            nonlocal total
            tok_f.write(np.asarray(ids, dtype=dtype).tobytes())
            if mask_f is not None and scored is not None:
                mask_f.write(np.asarray(scored, dtype=np.uint8).tobytes())
            total += len(ids)

        for path in spec.files:
            whole_file = file_kind(path) == "text"  # a text file is one document
            if whole_file:
                emit(start)
            for batch in _batched(read_documents(spec, path), _BATCH):
                if spec.instruction:
                    prompts = _encode(tokenizer, [p for p, _ in batch])
                    answers = _encode(tokenizer, [str(r) for _, r in batch])
                    for prompt, answer in zip(prompts, answers, strict=True):
                        head = [*start, *prompt]
                        emit([*head, *answer, eos], [0] * len(head) + [1] * (len(answer) + 1))
                        documents += 1
                    continue
                for ids in _encode(tokenizer, [text for text, _ in batch]):
                    emit(ids if whole_file else [*start, *ids, eos])
                    documents += 0 if whole_file else 1
            if whole_file:
                emit([eos])
                documents += 1
        for f in (tok_f, mask_f):
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
    return total, documents


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory`` (blocking): the others wait for the one tokenizing.

    The directory itself is locked, not a lock file: nothing is left behind, and a lock file
    removed while another process waits on it would let a third one in.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock, each process checks the cache
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _read_meta(directory: Path, key: str) -> dict[str, Any] | None:
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(meta, dict) and meta.get("key") == key and meta.get("version") == CACHE_VERSION
    if not ok:
        return None
    try:  # a truncated token file (a disk that lost it) is rebuilt, not read
        size = (directory / "tokens.bin").stat().st_size
        return meta if size == int(meta["num_tokens"]) * np.dtype(meta["dtype"]).itemsize else None
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _from_meta(directory: Path, meta: dict[str, Any], built: bool, started: float) -> TokenCache:
    return TokenCache(
        directory=directory,
        num_tokens=int(meta["num_tokens"]),
        num_documents=int(meta["num_documents"]),
        dtype=str(meta["dtype"]),
        has_mask=bool(meta["has_mask"]),
        built=built,
        seconds=time.perf_counter() - started,
    )


def prepare_tokens(
    spec: DataSpec,
    tokenizer: Any,
    cache_dir: str | os.PathLike[str],
    *,
    tokenizer_dir: Path | None = None,
) -> TokenCache:
    """The token cache of ``spec``'s files: found, or built now (once, by one process).

    Args:
        spec: The files and fields to read.
        tokenizer: The model's Hugging Face tokenizer.
        cache_dir: Where cache directories live (created if missing).
        tokenizer_dir: Where the tokenizer was loaded from (its files go into the key).

    Returns:
        The committed :class:`TokenCache`.

    Raises:
        ConfigError: One line naming the file, for a missing or unreadable file, an unknown
            type, a record that does not parse or lacks a field; or an empty result.
    """
    started = time.perf_counter()
    for path in spec.files:
        if not path.is_file():
            raise ConfigError(f"data file {path}: no such file")
        file_kind(path)
    key = _cache_key(spec, tokenizer_fingerprint(tokenizer, tokenizer_dir))
    root = Path(cache_dir)
    directory = root / key
    meta = _read_meta(directory, key)
    if meta is not None:
        return _from_meta(directory, meta, False, started)
    created = not root.exists()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cache_dir {root}: cannot create it ({err.strerror})") from None
    try:
        return _build(spec, tokenizer, root, key, started)
    except ConfigError:
        if created:  # bad input leaves nothing on disk
            with contextlib.suppress(OSError):
                root.rmdir()
        raise


def _build(spec: DataSpec, tokenizer: Any, root: Path, key: str, started: float) -> TokenCache:
    directory = root / key
    with _locked(root):
        meta = _read_meta(directory, key)  # another process may have built it meanwhile
        if meta is not None:
            return _from_meta(directory, meta, False, started)
        for stale in root.glob(f".{key}.tmp-*"):  # left by a process killed while tokenizing
            shutil.rmtree(stale, ignore_errors=True)
        dtype = np.dtype(np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.uint32)
        tmp = root / f".{key}.tmp-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            total, documents = _write_stream(spec, tokenizer, dtype, tmp)
            if total < 2:
                raise ConfigError(
                    f"data files {', '.join(map(str, spec.files))}: no text to train on"
                )
            meta = {
                "version": CACHE_VERSION,
                "key": key,
                "num_tokens": total,
                "num_documents": documents,
                "dtype": dtype.name,
                "has_mask": spec.instruction,
                "files": [str(p) for p in spec.files],
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))  # last: the commit mark
            if directory.exists():  # a directory without a valid meta.json: a dead attempt
                shutil.rmtree(directory)
            os.replace(tmp, directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return _from_meta(directory, meta, True, started)


# --- windows ----------------------------------------------------------------------------------


class PackedWindows(Dataset[tuple[Tensor, Tensor]]):
    """Fixed windows of a token stream as ``(inputs, targets)``; targets -100 where not scored.

    Window ``i`` is ``tokens[i*T : i*T + T + 1]`` for ``T = block_size`` (plus ``first``
    windows of offset): inputs are its first ``T`` ids, targets its last ``T``. The arrays
    are opened lazily (memory-mapped), so the dataset pickles cheaply.

    Args:
        cache: The token cache (or None with ``from_arrays``).
        block_size: Tokens per sample.
        first: Index of the first window of this split.
        count: Windows in this split (None: all from ``first``).
    """

    def __init__(
        self,
        cache: TokenCache | None,
        block_size: int,
        first: int = 0,
        count: int | None = None,
        *,
        arrays: tuple[np.ndarray, np.ndarray | None] | None = None,
    ) -> None:
        self.cache = cache
        self.block_size = block_size
        self._arrays = arrays
        total = cache.num_tokens if cache is not None else len(arrays[0]) if arrays else 0
        available = max(0, (total - 1) // block_size - first)
        self.first = first
        self.count = available if count is None else min(count, available)

    @classmethod
    def from_arrays(
        cls, tokens: np.ndarray, mask: np.ndarray | None, *, block_size: int
    ) -> PackedWindows:
        """Windows over in-memory arrays (tests, examples)."""
        return cls(None, block_size, arrays=(tokens, mask))

    def _open(self) -> tuple[np.ndarray, np.ndarray | None]:
        if self._arrays is None:
            assert self.cache is not None
            self._arrays = (self.cache.tokens(), self.cache.mask())
        return self._arrays

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.cache is not None:
            state["_arrays"] = None  # memory maps are reopened where the dataset lands
        return state

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if not 0 <= index < self.count:
            raise IndexError(f"window {index} out of range ({self.count} windows)")
        tokens, mask = self._open()
        start = (self.first + index) * self.block_size
        window = torch.from_numpy(tokens[start : start + self.block_size + 1].astype(np.int64))
        inputs, targets = window[:-1], window[1:].clone()
        if mask is not None:
            scored = torch.from_numpy(mask[start + 1 : start + self.block_size + 1].astype(bool))
            targets[~scored] = -100  # IGNORE_INDEX: prompt tokens are not scored
        return inputs, targets


def build_datasets(
    train: DataSpec,
    val: DataSpec | None,
    tokenizer: Any,
    *,
    block_size: int,
    val_fraction: float,
    cache_dir: Path,
    tokenizer_dir: Path | None = None,
) -> tuple[PackedWindows, PackedWindows | None]:
    """Training and validation windows of the files, tokenized once (:func:`prepare_tokens`).

    Args:
        train: The training files.
        val: Validation files; None holds out the last ``val_fraction`` of the training
            windows instead (by position: no window is in both splits).
        tokenizer: The model's tokenizer.
        block_size: Tokens per sample.
        val_fraction: Share of windows held out when ``val`` is None.
        cache_dir: Where the token caches live.
        tokenizer_dir: The tokenizer's directory (its files key the cache).

    Returns:
        ``(train, val)``; ``val`` is None when nothing is held out.

    Raises:
        ConfigError: Naming the file, for unreadable data; or too few tokens for one window.
    """
    cache = prepare_tokens(train, tokenizer, cache_dir, tokenizer_dir=tokenizer_dir)
    windows = PackedWindows(cache, block_size)
    if len(windows) < 1:
        raise ConfigError(
            f"field 'task_options.block_size': the training files hold {cache.num_tokens} "
            f"tokens, fewer than one window of {block_size} + 1",
            "task_options.block_size",
        )
    if val is not None:
        held = prepare_tokens(val, tokenizer, cache_dir, tokenizer_dir=tokenizer_dir)
        return windows, PackedWindows(held, block_size)
    n_val = int(len(windows) * val_fraction)
    if n_val == 0:
        return windows, None
    n_train = len(windows) - n_val
    return PackedWindows(cache, block_size, 0, n_train), PackedWindows(cache, block_size, n_train)
