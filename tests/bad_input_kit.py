"""Tools of the bad-input sweep (``test_bad_input.py``): sandboxes, snapshots, hostile files.

- :func:`train_sources` really trains the three tiny source jobs (plain, sharded DCP,
  DeepSpeed ZeRO-2) whose checkpoints every checkpoint case copies;
- :func:`snapshot` records a directory tree (names, sizes, content hashes) so that a case can
  prove it wrote nothing and lost nothing;
- :class:`Payload` is a pickle that runs ``touch MARKER`` when unpickled; :func:`poison_pt`,
  :func:`poison_metadata` and :func:`poison_distcp` plant it in a checkpoint's files and
  :func:`vouch` fixes the manifest (size and checksum) so that verification passes and the
  loader really reads the file;
- :data:`DAMAGES` damages a checkpoint in the five ways a disk or a crash does;
- :class:`Sandbox` is one case's directory: job files, copied checkpoints, expected fragments.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle
import shlex
import shutil
import subprocess
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from train_jobs import train as train_job

__all__ = [
    "DAMAGES",
    "FORMATS",
    "SOURCE_JOB",
    "STEPS",
    "Payload",
    "Sandbox",
    "diff",
    "job_dict",
    "mount_tmpfs",
    "poison_distcp",
    "poison_metadata",
    "poison_pt",
    "redirect_distcp",
    "remount_read_only",
    "set_manifest",
    "snapshot",
    "train_sources",
    "vouch",
]

SOURCE_JOB: dict[str, Any] = {
    "task": "charlm",
    "task_options": {"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32},
    "training": {
        "global_batch_size": 16,
        "per_device_batch_size": 8,
        "max_steps": 4,
        "precision": "fp32",
    },
    "checkpoint": {"every": 2},
    "run": {"plot": False, "tensorboard": False, "eval_batches": 2, "log_every": 1},
}
"""The tiny charlm job every source checkpoint is trained with (two checkpoints: 2 and 4)."""

STEPS = ("step-00000002", "step-00000004")

FORMATS: dict[str, dict[str, Any]] = {
    "plain": {"strategy": {"name": "ddp"}, "nproc": 1},
    "dcp": {"strategy": {"name": "fsdp"}, "nproc": 2},
    "deepspeed": {"strategy": {"name": "deepspeed", "zero_stage": 2}, "nproc": 2},
}
"""Checkpoint format -> the strategy that writes it and the ranks it is trained on."""


def job_dict(
    fmt: str, output_dir: Path, changes: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """:data:`SOURCE_JOB` for ``fmt`` writing into ``output_dir``, with dotted ``changes``."""
    job = json.loads(json.dumps(SOURCE_JOB))
    job["strategy"] = dict(FORMATS[fmt]["strategy"])
    job["run"]["output_dir"] = str(output_dir)
    for dotted, value in (changes or {}).items():
        node = job
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return job


def train_sources(root: Path) -> dict[str, Path]:
    """Trains the source job in every format, concurrently; returns format -> run directory.

    Each run directory holds ``checkpoints/step-00000002``, ``checkpoints/step-00000004`` and
    ``metrics.jsonl``.
    """

    def train(fmt: str) -> Path:
        out = root / fmt
        config = root / f"{fmt}.yaml"
        config.write_text(yaml.safe_dump(job_dict(fmt, out)))
        train_job(config, int(FORMATS[fmt]["nproc"]), timeout=240)
        found = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
        assert found == list(STEPS), found
        return out

    from importlib.util import find_spec

    formats = [f for f in FORMATS if f != "deepspeed" or find_spec("deepspeed") is not None]
    with ThreadPoolExecutor(len(formats)) as pool:
        runs = dict(zip(formats, pool.map(train, formats), strict=True))
    return runs


# ----------------------------------------------------------------------------------------------
# snapshots: nothing written, nothing lost

Entry = tuple[str, int, str]


def snapshot(root: Path) -> dict[str, Entry]:
    """Every path under ``root`` -> (kind, size, content hash or link target); links not followed."""
    found: dict[str, Entry] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            info = path.lstat()
            if path.is_symlink():
                found[rel] = ("link", 0, os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir", 0, "")
            else:
                digest = hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
                found[rel] = ("file", info.st_size, digest)
    return found


def diff(before: Mapping[str, Entry], after: Mapping[str, Entry]) -> dict[str, str]:
    """Path -> how it changed between two snapshots (created, removed, changed)."""
    changes = {}
    for rel in sorted(set(before) | set(after)):
        old, new = before.get(rel), after.get(rel)
        if old == new:
            continue
        if old is None:
            changes[rel] = "created"
        elif new is None:
            changes[rel] = "removed"
        else:
            changes[rel] = f"changed: {old[:2]} -> {new[:2]}"
    return changes


# ----------------------------------------------------------------------------------------------
# hostile files


class Payload:
    """Unpickling this runs ``touch MARKER``: the proof that a loader executed the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _checksum(data: bytes, like: str) -> str:
    """``data``'s checksum in the algorithm of the manifest's ``like`` (``xxh3:``/``crc32:``)."""
    if like.startswith("xxh3:"):
        import xxhash

        return f"xxh3:{xxhash.xxh3_64(data).intdigest():016x}"
    return f"crc32:{zlib.crc32(data):08x}"


def vouch(step_dir: Path, *names: str) -> None:
    """Makes the manifest list ``names`` with their current sizes and checksums.

    A listed file gets its entry fixed; an unlisted one is added. Whoever hands over a
    checkpoint writes its manifest too: verification then passes, and the loader reads it.
    """
    manifest_path = step_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    entries = {e["name"]: e for e in manifest["files"]}
    like = manifest["files"][0]["checksum"]
    for name in names:
        data = (step_dir / name).read_bytes()
        entries[name] = {"name": name, "size": len(data), "checksum": _checksum(data, like)}
    manifest["files"] = sorted(entries.values(), key=lambda e: str(e["name"]))
    manifest_path.write_text(json.dumps(manifest, indent=2))


def set_manifest(step_dir: Path, **fields: Any) -> None:
    """Rewrites top-level manifest fields (e.g. a lying ``state_format``)."""
    path = step_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(fields)
    path.write_text(json.dumps(manifest, indent=2))


def poison_pt(file: Path, marker: Path) -> None:
    """Re-saves a ``torch.save`` file (written by this suite) with a :class:`Payload` inside.

    The rest of the content stays, so a loader that ran the payload would carry on as usual.
    """
    import torch

    original = torch.load(file, map_location="cpu", weights_only=False)  # our own file
    value = (
        {**original, "payload": Payload(marker)}
        if isinstance(original, dict)
        else {
            "original": original,
            "payload": Payload(marker),
        }
    )
    buffer = io.BytesIO()
    torch.save(value, buffer)
    file.write_bytes(buffer.getvalue())


def poison_metadata(step_dir: Path, marker: Path) -> None:
    """DCP's ``.metadata`` (a raw pickle, not ``torch.save``) with a :class:`Payload` in it."""
    from gpu_training.checkpoint.dcp_read import read_dcp_metadata

    metadata = read_dcp_metadata(step_dir / ".metadata")
    metadata.planner_data = {"payload": Payload(marker)}
    (step_dir / ".metadata").write_bytes(pickle.dumps(metadata))


def poison_distcp(step_dir: Path, name: str, marker: Path) -> str:
    """Plants a :class:`Payload` in DCP data file ``name``, where the loader will read it.

    DCP unpickles non-tensor values (optimizer hyper-parameters) with ``weights_only=False``:
    the payload is appended to ``name`` and one such value is pointed at it in ``.metadata``.

    Returns:
        The name of the value now read from the payload.
    """
    import torch
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from gpu_training.checkpoint.dcp_read import read_dcp_metadata

    metadata = read_dcp_metadata(step_dir / ".metadata")
    fqn = next(
        k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)
    )
    buffer = io.BytesIO()
    torch.save(Payload(marker), buffer)
    blob = buffer.getvalue()
    target = step_dir / name
    offset = target.stat().st_size
    with open(target, "ab") as f:
        f.write(blob)
    assert metadata.storage_data is not None
    for index, info in list(metadata.storage_data.items()):
        if index.fqn == fqn:
            metadata.storage_data[index] = dataclasses.replace(
                info, relative_path=name, offset=offset, length=len(blob)
            )
    (step_dir / ".metadata").write_bytes(pickle.dumps(metadata))
    return fqn


def redirect_distcp(step_dir: Path, name: str, target: str) -> None:
    """Points every value DCP's ``.metadata`` stores in ``name`` at the path ``target``."""
    from gpu_training.checkpoint.dcp_read import read_dcp_metadata

    metadata = read_dcp_metadata(step_dir / ".metadata")
    assert metadata.storage_data is not None
    for index, info in list(metadata.storage_data.items()):
        if str(info.relative_path) == name:
            metadata.storage_data[index] = dataclasses.replace(info, relative_path=target)
    (step_dir / ".metadata").write_bytes(pickle.dumps(metadata))


# ----------------------------------------------------------------------------------------------
# damaged checkpoints


def _truncate(file: Path) -> None:
    with open(file, "r+b") as f:
        f.truncate(file.stat().st_size // 2)


def _flip_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def _garbage_manifest(file: Path) -> None:
    (file.parent / "manifest.json").write_bytes(b"\x00\xff{not json at all" * 7)


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "flipped-byte": _flip_byte,
    "missing-file": lambda file: file.unlink(),
    "missing-manifest": lambda file: (file.parent / "manifest.json").unlink(),
    "garbage-manifest": _garbage_manifest,
}
"""Damage -> what it does, given the step directory's main state file."""


# ----------------------------------------------------------------------------------------------
# file systems


@contextmanager
def mount_tmpfs(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (remounted read-only after ``read_only`` setup).

    Skips the test when this machine does not allow mounting (no root, a container...).
    """
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def remount_read_only(path: Path) -> None:
    """Remounts the tmpfs at ``path`` read-only (skips the test where that is refused)."""
    done = subprocess.run(
        ["mount", "-o", "remount,ro", str(path)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot remount read-only: {done.stderr.strip()}")


# ----------------------------------------------------------------------------------------------
# one case's directory


class Sandbox:
    """One case's directory: its job files, copied checkpoints and expected message fragments.

    Args:
        root: The case's ``tmp_path``; the case runs with it as working directory.
        sources: Returns format -> trained run directory (trains them on first use).
    """

    def __init__(self, root: Path, sources: Callable[[], Mapping[str, Path]]) -> None:
        self.root = root
        self.marker = root / "PAYLOAD_RAN"
        self.out = root / "out"
        self.expected: list[str] = []
        self.allowed: set[str] = set()
        self.allowed_trees: list[str] = []
        self.stack = ExitStack()
        """Closed after the case: mounts and other resources the case set up."""
        self._sources = sources

    def enter(self, context: AbstractContextManager[Path]) -> Path:
        """Enters ``context`` (e.g. :func:`mount_tmpfs`) until the case is over."""
        return self.stack.enter_context(context)

    @property
    def ckroot(self) -> Path:
        """The checkpoint root every job of this sandbox resumes from."""
        return self.out / "checkpoints"

    def expect(self, *fragments: object) -> None:
        """Fragments the error line must hold (paths known only once the case is built)."""
        self.expected += [str(f) for f in fragments]

    def allow(self, *paths: Path) -> None:
        """Paths the case may write (its intended outputs)."""
        self.allowed |= {str(p.relative_to(self.root)) for p in paths}

    def allow_tree(self, directory: Path) -> None:
        """Everything under ``directory`` may be written (a run's own output directory)."""
        self.allowed_trees.append(str(directory.relative_to(self.root)) + os.sep)

    def may_write(self, rel: str) -> bool:
        """Whether the case may create, change or remove ``rel`` (relative to the root)."""
        return rel in self.allowed or any(rel.startswith(tree) for tree in self.allowed_trees)

    def write(self, name: str, content: str | bytes) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def job(
        self,
        fmt: str = "plain",
        changes: Mapping[str, Any] | None = None,
        name: str = "job.yaml",
    ) -> Path:
        """A job file: the source job in ``fmt``, output under ``out/``, dotted ``changes``."""
        return self.write(name, yaml.safe_dump(job_dict(fmt, self.out, changes)))

    def checkpoint(self, fmt: str) -> Path:
        """A copy of the ``fmt`` source checkpoints at :attr:`ckroot`; returns it."""
        shutil.copytree(self._sources()[fmt] / "checkpoints", self.ckroot, symlinks=True)
        return self.ckroot

    def step(self, name: str = STEPS[-1]) -> Path:
        return self.ckroot / name

    def source_run(self, fmt: str) -> Path:
        return self._sources()[fmt]
