"""Every file of a committed checkpoint is on the disk before its manifest names it.

A writer the toolkit hands a staging directory to need not fsync what it writes (DeepSpeed's
``torch.save`` does not; DCP is asked not to): the commit protocol fsyncs each file itself.
These tests record every ``os.fsync`` by the inode of its descriptor (a rename keeps it) and
check that each file the manifest lists was fsynced before the manifest was, on the real save
paths.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from gpu_training.checkpoint import MANIFEST_NAME, CheckpointManager
from gpu_training.checkpoint.collective import save_directory
from gpu_training.checkpoint.directory import CheckpointDirectory
from gpu_training.checkpoint.formats import DEEPSPEED
from gpu_training.ddp import DistributedContext

SINGLE = DistributedContext()


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inodes of the files fsynced, in order (from any thread)."""
    inodes: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        inodes.append(os.fstat(fd).st_ino)

    monkeypatch.setattr(os, "fsync", fsync)
    return inodes


def _assert_durable_before_manifest(step_dir: Path, fsynced: list[int]) -> None:
    listed = [str(e["name"]) for e in json.loads((step_dir / MANIFEST_NAME).read_text())["files"]]
    assert listed, "the manifest lists no file"
    manifest = (step_dir / MANIFEST_NAME).stat().st_ino
    assert manifest in fsynced, "the manifest was not fsynced"
    before = fsynced[: fsynced.index(manifest)]
    late = [name for name in listed if (step_dir / name).stat().st_ino not in before]
    assert not late, f"not fsynced before the manifest: {late}"


def test_files_a_writer_leaves_unsynced_are_fsynced_before_the_manifest(
    tmp_path: Path, fsynced: list[int]
) -> None:
    def write(tmp: Path) -> set[str]:  # as DeepSpeed writes: torch.save, no fsync
        torch.save({"w": torch.ones(256)}, tmp / "mp_rank_00_model_states.pt")
        torch.save({"m": torch.ones(256)}, tmp / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
        return set()

    store = CheckpointDirectory(tmp_path)
    step_dir = save_directory(store, SINGLE, 3, write, DEEPSPEED, extra={"step": 3})
    assert step_dir is not None
    _assert_durable_before_manifest(step_dir, fsynced)


def test_sharded_save_fsyncs_every_dcp_file_before_the_manifest(
    tmp_path: Path, fsynced: list[int]
) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 8)).sum().backward()
    opt.step()
    step_dir = CheckpointManager(tmp_path, ctx=SINGLE).save_sharded(model, opt, 5, extra={"s": 5})
    assert step_dir is not None
    assert any(name.endswith(".distcp") for name in os.listdir(step_dir))
    _assert_durable_before_manifest(step_dir, fsynced)
