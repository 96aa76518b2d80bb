"""DCP's read of a verified checkpoint served from memory maps: one copy, into the model.

A sharded load reads every byte twice if done naively: the manifest's checksum pass reads
the files (:func:`~gpu_training.checkpoint.collective.choose_verified`), then DCP's
``FileSystemReader`` reads them again, ``torch.load``-ing each chunk into fresh memory and
copying it into the model's shard. :class:`MappedReader` maps each file it needs instead and
builds each chunk as a view of the mapping — the same page-cache pages the checksum pass just
read and hashed — so a chunk costs one copy, into the target tensor, and no new memory.

What it keeps from DCP's reader: the same read plan and planner calls (``resolve_tensor``,
``commit_tensor``, ``load_bytes``, so :class:`~gpu_training.checkpoint.dcp_read.SafeLoadPlanner`
still checks every non-tensor value with ``weights_only`` first) and the same size checks. Where
a chunk is anything but a plain tensor record (a storage transform, a storage that does not
map), that chunk goes through ``torch.load(weights_only=True)`` as DCP's reader does. A
chunk's dtype, shape and strides come from ``torch.load(weights_only=True,
map_location="meta")``, which unpickles the record's small header only.

Example:
    >>> import tempfile, warnings
    >>> import torch, torch.distributed.checkpoint as dcp
    >>> step_dir = tempfile.mkdtemp()
    >>> with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
    ...     warnings.simplefilter("ignore")
    ...     _ = dcp.save({"w": torch.arange(4.0)}, checkpoint_id=step_dir)
    ...     into = {"w": torch.zeros(4)}
    ...     dcp.load(into, storage_reader=MappedReader(step_dir))
    >>> into["w"].tolist()
    [0.0, 1.0, 2.0, 3.0]
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import warnings
from typing import IO, Any, cast

import torch
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from gpu_training.checkpoint.dcp_read import SafeReader

__all__ = ["MappedReader"]


class _Window(io.RawIOBase):
    """A read-only, seekable file object over ``view`` (no copy until ``readinto``)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    """The part of a stored chunk that a read item asks for (what DCP's reader narrows to)."""
    for dim, (start, length) in enumerate(zip(offsets, lengths, strict=True)):
        if start != 0 or length != tensor.size(dim):
            tensor = tensor.narrow(dim, start, length)
    return tensor


def _file(view: memoryview) -> IO[bytes]:
    return cast(IO[bytes], _Window(view))


def _map(fd: int, size: int) -> mmap.mmap:
    """A read-only private mapping of the file, its page tables filled at once where possible.

    The checksum pass has just read the file: its pages are in the page cache, and
    ``MAP_POPULATE`` maps them in one call instead of one fault per few pages. Read-only:
    a private writable mapping would be populated by copying every page.
    """
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ)


def _load_copy(mapping: mmap.mmap, offset: int, length: int) -> torch.Tensor:
    """The record at ``mapping[offset:offset + length]`` read as DCP's reader reads it (a copy)."""
    window = memoryview(mapping)[offset : offset + length]
    try:
        value = torch.load(_file(window), map_location="cpu", weights_only=True)
    finally:
        window.release()
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"a tensor chunk holds a {type(value).__name__}")
    return value


def _copy_mapped(
    mapping: mmap.mmap, offset: int, length: int, item: ReadItem, target: torch.Tensor
) -> bool:
    """Copies the rows ``item`` asks for from the record at ``mapping[offset:]`` into ``target``.

    Byte for byte from the mapping, no intermediate tensor. False (nothing copied) when the
    record is not one contiguous run of ``target``'s dtype holding those rows contiguously.
    """
    window = memoryview(mapping)[offset : offset + length]
    try:
        # unpickles the header only: a storage on "meta" records where its bytes are
        meta = torch.load(_file(window), map_location="meta", weights_only=True)
    finally:
        window.release()
    if not isinstance(meta, torch.Tensor):
        return False
    start = getattr(meta.untyped_storage(), "_checkpoint_offset", None)
    if (
        start is None
        or meta.dtype != target.dtype
        or not (meta.is_contiguous() and target.is_contiguous())
        or any(o != 0 for o in item.storage_offsets[1:])
        or list(item.lengths[1:]) != list(meta.shape[1:])
    ):
        return False
    # only the first dimension is narrowed: the rows asked for are one run of bytes
    # (records start anywhere in the file: the bytes are copied as bytes, never read unaligned)
    row = meta[0].numel() if meta.dim() else 1
    first = int(item.storage_offsets[0]) if meta.dim() else 0
    nbytes = target.numel() * meta.element_size()
    begin = offset + start + (meta.storage_offset() + first * row) * meta.element_size()
    if begin + nbytes > offset + length:
        return False
    if nbytes:
        with warnings.catch_warnings():  # "not writable": it is only read, by copy_
            warnings.simplefilter("ignore", UserWarning)
            source = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=begin)
        target.reshape(-1).view(torch.uint8).copy_(source)
        del source  # a view of the mapping: released before the mapping is closed
    return True


class MappedReader(SafeReader):
    """A :class:`~gpu_training.checkpoint.dcp_read.SafeReader` that maps the files it reads.

    Each chunk is a view of the file's mapping (private and read-only: nothing can write
    back), copied once into the tensor the planner resolves; the mapping is released when
    the file is done.
    """

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            if getattr(info, "transform_descriptors", None):
                return super().read_data(plan, planner)  # DCP's own path undoes transforms
            per_file.setdefault(str(info.relative_path), []).append(item)
        for name, items in per_file.items():
            self._read_file(os.path.join(self.path, name), items, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_file(self, path: str, items: list[ReadItem], planner: LoadPlanner) -> None:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mapping = _map(f.fileno(), size) if size else None
        try:
            # in file order: the pages come in sequence if the checksum pass did not cache them
            for item in sorted(items, key=lambda i: self._info(i.storage_index).offset):
                info = self._info(item.storage_index)
                if info.offset + info.length > size or mapping is None:
                    raise ValueError(f"{path}: a chunk ends past the file's {size} bytes")
                if item.type == LoadItemType.BYTE_IO:
                    blob = io.BytesIO(mapping[info.offset : info.offset + info.length])
                    planner.load_bytes(item, blob)
                    continue
                target = planner.resolve_tensor(item).detach()
                if list(item.lengths) != list(target.size()):
                    raise ValueError(
                        f"{path}: chunk {item.storage_index.fqn!r} gives shape "
                        f"{tuple(item.lengths)}, the model's is {tuple(target.size())}"
                    )
                if not _copy_mapped(mapping, info.offset, info.length, item, target):
                    source = _load_copy(mapping, info.offset, info.length)
                    target.copy_(_narrow(source, item.storage_offsets, item.lengths))
                planner.commit_tensor(item, target)
        finally:
            if mapping is not None:
                with contextlib.suppress(BufferError):  # a view still alive: GC unmaps it
                    mapping.close()

    def _info(self, index: MetadataIndex) -> Any:
        return self.storage_data[index]
