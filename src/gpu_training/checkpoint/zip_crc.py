"""``torch.save`` without the zip's CRC32: the manifest's checksums already cover every byte.

``torch.save`` writes a zip archive and by default computes a CRC32 of every record, with
miniz's table-driven CRC at a few hundred MB/s: on a CPU shared by several ranks that cost
more than writing the bytes (``benchmarks/README.md``, "Checkpoint bandwidth"). Nothing reads
it back — ``torch.load`` does not check it — while every file of a checkpoint is hashed into
its manifest (XXH3) and verified before a load. So the checkpoint writers (``state.pt``, DCP's
shards, ``extra.pt``) save inside :func:`without_zip_crc32`; files stay readable by any
``torch.load`` (the zip's CRC fields hold 0).

Example:
    >>> import io, torch
    >>> buffer = io.BytesIO()
    >>> with without_zip_crc32():
    ...     torch.save({"w": torch.ones(2)}, buffer)
    >>> _ = buffer.seek(0)
    >>> torch.load(buffer, weights_only=True)["w"].tolist()
    [1.0, 1.0]
    >>> torch.serialization.get_crc32_options()  # the process's setting is back
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["without_zip_crc32"]


@contextlib.contextmanager
def without_zip_crc32() -> Iterator[None]:
    """Turns ``torch.save``'s per-record CRC32 off in this thread while active.

    torch keeps the setting per thread (a ``ContextVar``): an asynchronous save's writer
    thread switches its own, and the caller's setting comes back on exit, nested or not.

    Yields:
        Nothing; use it as ``with without_zip_crc32(): torch.save(...)``.
    """
    import torch

    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)
