"""The on-disk layout of a checkpoint, and the durable file-system moves that write it.

Names and format constants, :class:`CheckpointError`, the checksum-while-writing file object,
fsync of files and directories, the atomic ``renameat2(RENAME_EXCHANGE)`` swap, locked
temporary directories, the scan for step directories, and the manifest (built, written, checked)
that every writer, loader and verifier of the package shares.

The helpers have public names because the package's modules share them; the package does not
re-export them (``gpu_training.checkpoint`` exports the constants and the error only).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
import secrets
import stat
import sys
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, cast

try:  # the fast checksum; without it new checkpoints use zlib's CRC32
    import xxhash as _xxhash
except ImportError:  # pragma: no cover - xxhash is a core dependency
    _xxhash = None  # type: ignore[assignment]

try:  # POSIX only: without it a writer's temporary directory is not protected by a lock
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEEPSPEED_FORMAT",
    "EXTRA_NAME",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SHARDED_FORMAT",
    "STATE_NAME",
    "CheckpointError",
]

FORMAT_NAME = "gpu_training.checkpoint"
FORMAT_VERSION = 1
"""Version of the directory layout and manifest; bumped on incompatible changes."""
MANIFEST_NAME = "manifest.json"
STATE_NAME = "state.pt"
SHARDED_FORMAT = "dcp"
"""``manifest["state_format"]`` of a sharded (DCP) checkpoint (checkpoint/sharded.py)."""
DEEPSPEED_FORMAT = "deepspeed"
"""``manifest["state_format"]`` of a DeepSpeed engine checkpoint (checkpoint/zero.py)."""
EXTRA_NAME = "extra.pt"
"""The file of a sharded checkpoint holding its ``extra`` state (rank 0's copy)."""

_CHECKSUM_RE = re.compile(r"xxh3:[0-9a-f]{16}|crc32:[0-9a-f]{8}")
TMP_PREFIX = ".tmp-"
"""Temporary directories (a save in progress, a prune, a swapped-out step) start with this."""
STEP_RE = re.compile(r"step-(\d{8,})")
"""A step directory's name: ``step-`` and at least eight digits."""
_READ_CHUNK = 8 << 20
_OVERLAP_MIN_BYTES = 1 << 20  # below this, handing a chunk to the hashing thread costs more
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, verified or loaded; the message names the path."""


def refused_by_environment(error: BaseException) -> bool:
    """Whether an OSError (a full disk, a permission) is among ``error``'s causes: the file
    system refused, not a bug of the code that was saving.

    Example:
        >>> try:
        ...     raise CheckpointError("could not save") from OSError(28, "No space left")
        ... except CheckpointError as err:
        ...     refused_by_environment(err)
        True
    """
    cause: BaseException | None = error
    for _ in range(8):
        if cause is None:
            return False
        if isinstance(cause, OSError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


# ----------------------------------------------------------------------------------------------
# durable file-system primitives


class Checksum:
    """A running checksum of one file's bytes, written ``"<algorithm>:<hex>"`` in manifests.

    ``xxh3`` (XXH3-64, the ``xxhash`` package) when available, else ``crc32`` (zlib): XXH3 is
    several times faster than CRC32 and BLAKE2b, so the checksum does not sit on a save's
    critical path (CRC32 was slower than the page-cache write it ran beside; figures in
    benchmarks/README.md, ``bench_checkpoint.py``). Either catches torn and corrupted files,
    which is the job here; neither defends against someone who can rewrite the manifest.
    Manifests with either algorithm verify, whichever one writes new checkpoints.

    Args:
        algorithm: ``"xxh3"`` or ``"crc32"`` (default: :func:`default_checksum`).
    """

    def __init__(self, algorithm: str | None = None) -> None:
        self.algorithm = algorithm or default_checksum()
        if self.algorithm == "xxh3":
            if _xxhash is None:
                raise CheckpointError(
                    "an xxh3 checksum needs the xxhash package (pip install xxhash)"
                )
            self._xxh = _xxhash.xxh3_64()
        elif self.algorithm != "crc32":
            raise ValueError(f"unknown checksum algorithm {self.algorithm!r}")
        self._crc = 0

    def update(self, data: bytes | memoryview) -> None:
        """Adds ``data`` (both implementations release the GIL on large buffers)."""
        if self.algorithm == "xxh3":
            self._xxh.update(data)
        else:
            self._crc = zlib.crc32(data, self._crc)

    def text(self) -> str:
        """``"xxh3:<16 hex digits>"`` or ``"crc32:<8 hex digits>"``."""
        if self.algorithm == "xxh3":
            return f"xxh3:{self._xxh.intdigest():016x}"
        return f"crc32:{self._crc:08x}"


def default_checksum() -> str:
    """The algorithm new checkpoints use: ``xxh3`` with ``xxhash`` installed, else ``crc32``."""
    return "xxh3" if _xxhash is not None else "crc32"


class HashingWriter:
    """The file object handed to ``torch.save``: writes through and hashes the same bytes."""

    def __init__(
        self, raw: BinaryIO, pool: ThreadPoolExecutor, algorithm: str | None = None
    ) -> None:
        self._raw = raw
        self._pool = pool
        self.checksum = Checksum(algorithm)
        self._overlap = self.checksum.algorithm == "crc32"
        self.size = 0
        self.error: OSError | None = None
        """The first OSError of a write (torch.save reports it only as "unexpected pos")."""

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        try:
            if self._overlap and view.nbytes >= _OVERLAP_MIN_BYTES:
                # CRC32 is as slow as the write: hash on a second core meanwhile. XXH3 is
                # hashed inline: a thread hand-off per record cost more than the hash.
                job = self._pool.submit(self.checksum.update, view)
                try:
                    written = self._raw.write(view)
                finally:
                    job.result()  # wait even on error: torch frees the buffer after us
            else:
                self.checksum.update(view)
                written = self._raw.write(view)
        except OSError as exc:  # ENOSPC, EFBIG...: keep it, torch replaces it by its own error
            self.error = self.error or exc
            raise
        self.size += written
        return written

    def flush(self) -> None:
        self._raw.flush()


def fsync_file(path: Path) -> None:
    """Makes ``path``'s bytes durable, whichever process wrote them (an fsync of a new descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Makes renames and creations inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems cannot fsync a directory; nothing more to do
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def read_ahead(path: Path, offset: int, length: int) -> None:
    """Asks the kernel to start reading ``path[offset:offset + length]`` into the page cache.

    Returns at once (``POSIX_FADV_WILLNEED``). Only advice: a link, a FIFO, a missing file
    or a system without the call is left alone (the checksum pass names what is wrong).
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:  # pragma: no cover - not POSIX
        return
    # never follow a link out of the checkpoint; never block opening a FIFO
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            advise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_checksum(path: Path, algorithm: str | None = None) -> str:
    """``"<algorithm>:<hex>"`` of a file's bytes (see :class:`Checksum`)."""
    checksum = Checksum(algorithm)
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            checksum.update(view[:n])
    return checksum.text()


def _checksum_mismatch(path: Path, expected: str) -> bool:
    """Whether ``path``'s bytes do not hash to ``expected`` (computed with its algorithm)."""
    return file_checksum(path, expected.split(":", 1)[0]) != expected


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast(Callable[..., int], fn)


def exchange(a: Path, b: Path) -> bool:
    """Atomically swaps two paths (Linux ``RENAME_EXCHANGE``); False where unsupported."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on directory ``path``, or None if another holds it.

    A writer holds this lock on its temporary directory for the whole save, so
    :meth:`CheckpointManager.clean_stale` in another process never removes a save in progress;
    the kernel drops the lock when the writer dies, even by SIGKILL.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:  # file system without flock: nothing can be protected, carry on unlocked
        return fd
    return fd


def make_locked_tmp(directory: Path, name: str) -> tuple[Path, int]:
    """Creates and locks ``directory/.tmp-NAME-<random>``; retries if a cleaner raced us."""
    for _ in range(5):
        tmp = directory / f"{TMP_PREFIX}{name}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            fd = try_lock(tmp)
        except FileNotFoundError:  # removed by a concurrent clean_stale before we locked it
            continue
        if fd is None:
            continue
        try:  # still our directory, not one a cleaner deleted between mkdir and lock?
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                return tmp, fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise CheckpointError(f"could not create a temporary directory in {directory}")


# ----------------------------------------------------------------------------------------------
# the manifest


def build_manifest(
    step: int,
    world_size: int,
    files: list[dict[str, Any]],
    *,
    state_format: str | None = None,
    config_hash: str | None = None,
    config: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``manifest.json`` of a checkpoint, for every format (written last, by rank 0).

    Args:
        step: The step the checkpoint holds.
        world_size: Ranks that wrote it.
        files: ``{"name", "size", "checksum"}`` of every state file.
        state_format: ``"dcp"``, ``"deepspeed"``, or None for a plain ``state.pt``.
        config_hash: A hash of the settings that define the run's math.
        config: The job's settings themselves (plain data), so that a resume with other
            settings can name the fields that changed.
        metadata: The caller's JSON-serialisable extras.

    Returns:
        The manifest as a dict (``json.dumps``-able).
    """
    from datetime import datetime, timezone

    import torch

    manifest: dict[str, Any] = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION}
    if state_format is not None:
        manifest["state_format"] = state_format
    manifest.update(
        step=step,
        world_size=world_size,
        config_hash=config_hash,
        created=datetime.now(timezone.utc).isoformat(),
        torch_version=torch.__version__,
        metadata=dict(metadata or {}),
        files=sorted(files, key=lambda e: str(e["name"])),
    )
    if config is not None:
        manifest["config"] = json.loads(json.dumps(config, default=str))
    return manifest


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def run_layout(manifest: Mapping[str, Any]) -> dict[str, int] | None:
    """How the run that wrote a checkpoint split its global batch.

    The Trainer records the training settings resolved for its world size (``config``'s
    ``training``: ``world_size``, ``per_device_batch_size``, ``gradient_accumulation_steps``);
    manifests written before recorded the job as written, for one process: their
    accumulation is derived again from ``global_batch_size`` and the manifest's
    ``world_size``, as the run derived it.

    Args:
        manifest: A parsed manifest.

    Returns:
        ``{"world_size", "per_device_batch_size", "gradient_accumulation_steps",
        "global_batch_size"}``, or None when the manifest records no training settings (a
        hand-written loop's checkpoint) or they do not add up.

    Example:
        >>> old = {"world_size": 2, "config": {"training": {"world_size": 1,
        ...        "per_device_batch_size": 4, "gradient_accumulation_steps": 2,
        ...        "global_batch_size": 8}}}
        >>> list(run_layout(old).values())  # ranks, per device, accumulation, global batch
        [2, 4, 1, 8]
    """
    config = manifest.get("config")
    training = config.get("training") if isinstance(config, Mapping) else None
    if not isinstance(training, Mapping):
        return None
    world = _count(manifest.get("world_size"))
    per_device = _count(training.get("per_device_batch_size"))
    accumulation = _count(training.get("gradient_accumulation_steps"))
    global_batch = training.get("global_batch_size")
    if world is None or per_device is None or accumulation is None:
        return None
    if global_batch is not None and training.get("world_size") != world:
        # recorded before the split that ran was: the run derived it from the global batch
        total = _count(global_batch)
        if total is None or total % (per_device * world):
            return None
        accumulation = total // (per_device * world)
    return {
        "world_size": world,
        "per_device_batch_size": per_device,
        "gradient_accumulation_steps": accumulation,
        "global_batch_size": per_device * accumulation * world,
    }


def write_manifest(directory: Path, manifest: Mapping[str, Any], *, sync: bool = True) -> None:
    """Writes ``directory/manifest.json``: the last file of a checkpoint, which makes it one.

    Args:
        directory: The temporary step directory, every state file already complete in it.
        manifest: What :func:`build_manifest` returned.
        sync: fsync the file and the directory before returning (a caller that overlaps its
            fsyncs passes False and syncs them itself).
    """
    with open(directory / MANIFEST_NAME, "wb") as f:
        f.write(json.dumps(manifest, indent=2).encode())
        f.flush()
        if sync:
            os.fsync(f.fileno())
    if sync:
        fsync_dir(directory)


# ----------------------------------------------------------------------------------------------
# step directories


def step_name(step: int) -> str:
    """``step-00001234``: the directory of checkpoint ``step``."""
    return f"step-{step:08d}"


def check_step(step: object) -> int:
    """``step`` when it is an integer >= 0 (not a bool); ValueError otherwise."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    return step


def scan_step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every ``step-XXXXXXXX`` directory in ``root``, committed or not, by ascending step.

    Links and names that are not exactly :func:`step_name` of their number are not steps.
    """
    if not root.is_dir():
        return []
    with os.scandir(root) as entries:
        found = [
            (int(match.group(1)), Path(entry.path))
            for entry in entries
            if (match := STEP_RE.fullmatch(entry.name))
            and entry.name == step_name(int(match.group(1)))
            and entry.is_dir(follow_symlinks=False)
        ]
    return sorted(found)


# ----------------------------------------------------------------------------------------------
# manifest checks


def manifest_problems(manifest: Any, path: Path) -> list[str]:
    """Structural problems of a parsed manifest (files are not looked at)."""
    if not isinstance(manifest, dict):
        return [f"{path / MANIFEST_NAME}: not a JSON object"]
    problems = []
    if manifest.get("format") != FORMAT_NAME:
        problems.append(
            f"{path / MANIFEST_NAME}: format is {manifest.get('format')!r}, "
            f"expected {FORMAT_NAME!r}"
        )
    version = manifest.get("format_version")
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        problems.append(
            f"{path / MANIFEST_NAME}: format_version {version!r} is not supported "
            f"(this version reads 1..{FORMAT_VERSION})"
        )
    step = manifest.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        problems.append(f"{path / MANIFEST_NAME}: step must be an integer, got {step!r}")
    elif STEP_RE.fullmatch(path.name) and path.name != step_name(step):
        problems.append(f"{path / MANIFEST_NAME}: step {step} does not match {path.name}")
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        return [*problems, f"{path / MANIFEST_NAME}: 'files' must be a non-empty list"]
    for entry in files:
        name = entry.get("name") if isinstance(entry, dict) else None
        ok = (
            isinstance(name, str)
            and name not in ("", ".", "..")
            and "/" not in name
            and "\\" not in name
            and isinstance(entry.get("size"), int)
            and isinstance(entry.get("checksum"), str)
            and _CHECKSUM_RE.fullmatch(entry["checksum"]) is not None
        )
        if not ok:
            problems.append(
                f"{path / MANIFEST_NAME}: bad file entry {entry!r} (expected "
                "name, size and checksum 'xxh3:<16 hex digits>' or 'crc32:<8 hex digits>')"
            )
    return problems


def entry_problem(path: Path, entry: Mapping[str, Any], *, checksums: bool) -> str | None:
    """What is wrong with one manifest entry's file in ``path`` (None: size and checksum match)."""
    file = path / entry["name"]
    try:
        info = file.lstat()  # never follow a link: it could point anywhere on the machine
    except OSError:
        return f"{file}: listed in the manifest but missing"
    if stat.S_ISLNK(info.st_mode):
        return f"{file}: a symbolic link (a checkpoint's files must be inside it; not followed)"
    if not stat.S_ISREG(info.st_mode):
        return f"{file}: not a regular file"
    size = info.st_size
    if size != entry["size"]:
        return f"{file}: {size} bytes, the manifest says {entry['size']} (truncated or overwritten)"
    if checksums and _checksum_mismatch(file, entry["checksum"]):
        return (
            f"{file}: checksum mismatch, the manifest says {entry['checksum']} "
            "(the file is corrupted)"
        )
    return None
