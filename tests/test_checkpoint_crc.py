"""The checkpoint writers skip ``torch.save``'s zip CRC32 (the manifest's checksums cover it).

What it buys is measured by ``benchmarks/bench_checkpoint_bandwidth.py``; here: the CRC
fields really are left empty, the files still load, damage is still caught by the manifest,
and the process's own setting comes back, from several threads at once too.
"""

from __future__ import annotations

import threading
import zipfile
from pathlib import Path

import pytest
import torch

from gpu_training.checkpoint import CheckpointError, CheckpointManager
from gpu_training.checkpoint.zip_crc import without_zip_crc32
from gpu_training.ddp import DistributedContext


def _state() -> dict[str, object]:
    torch.manual_seed(0)
    return {"model_state": torch.nn.Linear(64, 32).state_dict(), "step": 3}


def test_plain_save_leaves_the_zip_crc_empty_and_loads_back(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, ctx=DistributedContext(), keep_last_n=None)
    state = _state()
    path = ckpt.save(state, step=3)
    assert path is not None
    with zipfile.ZipFile(path / "state.pt") as archive:
        crcs = {info.filename: info.CRC for info in archive.infolist()}
    assert crcs and set(crcs.values()) == {0}, crcs
    assert torch.serialization.get_crc32_options() is True  # the process's setting is back
    loaded = ckpt.load(3)
    for key, tensor in state["model_state"].items():  # type: ignore[attr-defined]
        assert torch.equal(loaded["model_state"][key], tensor)


def test_a_plain_torch_save_still_writes_the_crc(tmp_path: Path) -> None:
    """The negative control: outside the writers torch's CRC32 is untouched."""
    torch.save(_state(), tmp_path / "bare.pt")
    with zipfile.ZipFile(tmp_path / "bare.pt") as archive:
        assert any(info.CRC != 0 for info in archive.infolist())


def test_damage_is_still_caught_by_the_manifest(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, ctx=DistributedContext(), keep_last_n=None)
    path = ckpt.save(_state(), step=1)
    assert path is not None
    data = bytearray((path / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the weights: torch.load alone would not notice
    (path / "state.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        ckpt.load(1)


def test_sharded_save_round_trips_without_the_crc(tmp_path: Path) -> None:
    ckpt = CheckpointManager(tmp_path, ctx=DistributedContext(), keep_last_n=None)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    ckpt.save_sharded(model, None, step=2, extra={"step": 2})
    other = torch.nn.Linear(16, 8)
    assert ckpt.load_sharded(other, None, 2) == {"step": 2}
    assert torch.equal(other.weight, model.weight)


def test_the_setting_is_per_thread_and_comes_back() -> None:
    seen: dict[str, bool] = {}

    def other_thread() -> None:
        seen["other"] = torch.serialization.get_crc32_options()

    with without_zip_crc32():
        with without_zip_crc32():
            assert torch.serialization.get_crc32_options() is False
        assert torch.serialization.get_crc32_options() is False  # the outer one still holds
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(timeout=30)
    assert seen == {"other": True}  # a user's torch.save in another thread keeps its CRC
    assert torch.serialization.get_crc32_options() is True
    torch.serialization.set_crc32_options(False)  # a user's own choice is kept too
    try:
        with without_zip_crc32():
            pass
        assert torch.serialization.get_crc32_options() is False
    finally:
        torch.serialization.set_crc32_options(True)
