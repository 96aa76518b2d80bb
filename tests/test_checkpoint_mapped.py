"""Sharded and DeepSpeed loads read each byte from the disk once, and copy it once.

:class:`~gpu_training.checkpoint.dcp_mapped.MappedReader` serves DCP's reads from memory maps
of the files the checksum pass has just read; DeepSpeed's own loads run memory-mapped
(:func:`~gpu_training.checkpoint.zero_read.mapped_loads`). What must hold: the same bits as
DCP's own reader for every kind of chunk, the fast path really taken (its fallback made to
fail), a corrupted byte refused before any weight is touched, and no tensor left backed by a
checkpoint file once the load returns (``/proc/self/maps`` names none; a load that leaves
the moments mapped is caught by the same check).
"""

from __future__ import annotations

import os
import sys
import warnings
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

import gpu_training.checkpoint.collective as collective
import gpu_training.checkpoint.dcp_mapped as dcp_mapped
from dist_harness import REPO_ROOT, run_ranks
from gpu_training.checkpoint import CheckpointError, CheckpointManager
from gpu_training.checkpoint.dcp_mapped import MappedReader
from gpu_training.ddp import DistributedContext

SINGLE = DistributedContext()
needs_proc_maps = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/maps"
)


def _mapped_files(under: Path) -> list[str]:
    """The files under ``under`` that this process has mapped now."""
    import gc

    gc.collect()  # a mapping dropped but not yet collected is not a leak
    lines = Path("/proc/self/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in lines if str(under) in line})


def _state() -> dict[str, Any]:
    """Every kind of chunk DCP writes: odd offsets in the file, views, dtypes, empty, scalar."""
    torch.manual_seed(0)
    base = torch.randn(7, 5)
    return {
        "w": torch.randn(33, 17),
        "bf16": torch.randn(9, 3).to(torch.bfloat16),
        "ints": torch.arange(-5, 6, dtype=torch.int64),
        "bytes": torch.tensor([1, 2, 255], dtype=torch.uint8),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "rows": base[2:5],  # a view: torch.save keeps the whole storage and an offset
        "transposed": base.t(),  # not contiguous: read through torch.load
        "note": "text",
        "n": 7,
    }


def _zeros_like(state: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in state.items():
        out[key] = torch.zeros_like(value).contiguous() if isinstance(value, torch.Tensor) else None
    if "transposed" in state:
        out["transposed"] = torch.zeros_like(state["transposed"])  # keeps the saved strides
    return out


def _save(state: dict[str, Any], where: Path) -> None:
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=where)


def _load(into: dict[str, Any], reader: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(into, storage_reader=reader)


def test_the_mapped_reader_reads_the_same_bits_as_dcps_own(tmp_path: Path) -> None:
    state = _state()
    _save(state, tmp_path)
    ours, theirs = _zeros_like(state), _zeros_like(state)
    _load(ours, MappedReader(tmp_path))
    _load(theirs, dcp.FileSystemReader(tmp_path))
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
            assert torch.equal(ours[key], theirs[key]), key
        else:
            assert ours[key] == value == theirs[key], key


def test_contiguous_chunks_are_copied_from_the_mapping_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback (``torch.load`` into new memory) made to fail: plain chunks never use it."""
    state = {k: v for k, v in _state().items() if k != "transposed"}
    _save(state, tmp_path)

    calls: list[int] = []
    real = dcp_mapped._load_copy

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dcp_mapped, "_load_copy", counted)
    into = _zeros_like(state)
    _load(into, MappedReader(tmp_path))
    assert all(torch.equal(into[k], v) for k, v in state.items() if isinstance(v, torch.Tensor))
    assert calls == []
    # the control: a strided chunk does take the fallback, and the count sees it
    _save({"transposed": _state()["transposed"]}, tmp_path / "strided")
    strided = {"transposed": torch.zeros(7, 5).t()}
    _load(strided, MappedReader(tmp_path / "strided"))
    assert calls == [1] and torch.equal(strided["transposed"], _state()["transposed"])


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("writers", [1, 2, 4])
def test_every_file_is_checksummed_by_one_rank_each_rank_its_own(
    world_size: int, writers: int
) -> None:
    """On load rank r checksums the files rank r wrote (what it loads next at that size)."""
    names = [f"__{r}_0.distcp" for r in range(writers)] + [".metadata", "extra.pt"]
    names += [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(writers)]
    names += ["mp_rank_00_model_states.pt"]
    entries = [{"name": n, "size": 100 + i} for i, n in enumerate(names)]
    shares = [
        [
            e["name"]
            for e in collective._checksum_share(
                entries, DistributedContext(rank=r, world_size=world_size)
            )
        ]
        for r in range(world_size)
    ]
    flat = [n for share in shares for n in share]
    assert sorted(flat) == sorted(names)  # each file once: none skipped, none twice
    if writers == world_size:
        for r, share in enumerate(shares):
            assert (
                f"__{r}_0.distcp" in share
                and f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" in share
            )


def test_read_ahead_is_only_advice_and_never_follows_or_blocks(tmp_path: Path) -> None:
    from gpu_training.checkpoint.files import read_ahead

    (tmp_path / "data.bin").write_bytes(bytes(4096))
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would block without O_NONBLOCK
    (tmp_path / "link").symlink_to(tmp_path / "data.bin")
    for name in ("data.bin", "fifo", "link", "missing"):
        read_ahead(tmp_path / name, 0, 4096)  # returns; raises nothing


def test_large_unwritten_files_are_read_ahead_in_slices_by_the_other_ranks() -> None:
    big = 200 << 20
    entries = [
        {"name": f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", "size": big} for r in range(4)
    ]
    entries += [{"name": "mp_rank_00_model_states.pt", "size": big + 1}]
    entries += [{"name": "extra.pt", "size": 10}]
    slices = {
        r: collective._read_ahead_share(
            entries, DistributedContext(rank=r, world_size=4, local_world_size=4)
        )
        for r in range(4)
    }
    assert slices[3] == []  # rank 3 checksums the model states itself
    for r in range(3):
        assert slices[r] == [("mp_rank_00_model_states.pt", r * (big // 4 + 1), big // 4 + 1)]
    two_nodes = DistributedContext(rank=0, world_size=4, local_world_size=2)
    assert collective._read_ahead_share(entries, two_nodes) == []  # not its page cache


def _model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 6)).square().mean().backward()
    opt.step()
    return model, opt


@needs_proc_maps
def test_a_sharded_load_leaves_nothing_mapped_and_refuses_a_flipped_byte_untouched(
    tmp_path: Path,
) -> None:
    model, opt = _model(0)
    ckpt = CheckpointManager(tmp_path, ctx=SINGLE)
    path = ckpt.save_sharded(model, opt, 1)
    assert path is not None
    fresh, fresh_opt = _model(1)
    ckpt.load_sharded(fresh, fresh_opt, 1)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True)
    )
    assert _mapped_files(tmp_path) == []

    # one byte of the weights flipped: refused, and no weight of the model changed
    shard = path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    other, other_opt = _model(2)
    before = [p.detach().clone() for p in other.parameters()]
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        ckpt.load_sharded(other, other_opt, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters(), strict=True))


DS_CONFIG = REPO_ROOT / "configs" / "deepspeed_config.json"


def _deepspeed_worker(root: str) -> dict[str, Any]:
    """1 rank: ZeRO-2 saves, steps on, loads back: moments bitwise, the same tensors, unmapped."""
    from gpu_training.checkpoint.zero_read import guarded
    from gpu_training.config import TrainingConfig
    from gpu_training.ddp import cleanup_distributed, init_distributed
    from gpu_training.resume import capture_run_state
    from gpu_training.strategy import prepare

    ctx = init_distributed()
    try:
        cfg = TrainingConfig(per_device_batch_size=4, precision="fp32", learning_rate=0.05)
        strategy = {"name": "deepspeed", "zero_stage": 2, "deepspeed_config": str(DS_CONFIG)}
        torch.manual_seed(0)
        run = prepare(nn.Linear(4, 2), strategy, ctx, cfg, device="cpu")
        x, y = torch.randn(4, 4), torch.randn(4, 2)

        def step() -> None:
            run.steps.backward(nn.functional.mse_loss(run.model(x), y))
            run.steps.step(0)

        engine: Any = run.model  # the DeepSpeedEngine

        def moments() -> dict[str, torch.Tensor]:
            state = engine.optimizer.optimizer.state
            return {f"{i}.{k}": v for i, s in enumerate(state.values()) for k, v in s.items()}

        step()
        saved = {k: v.clone() for k, v in moments().items()}
        ckpt = CheckpointManager(root, ctx=ctx)
        path = run.save_checkpoint(ckpt, capture_run_state(ctx, step=1))
        step()  # the moments move on; the load puts them back
        held = {k: id(v) for k, v in moments().items()}
        run.load_checkpoint(ckpt, 1)
        out = {
            "restored": all(torch.equal(moments()[k], v) for k, v in saved.items()),
            "same_tensors": {k: id(v) for k, v in moments().items()} == held,
            "mapped": _mapped_files(Path(root)),
        }
        # the control: DeepSpeed's load mapped without the copy back leaves the files mapped
        engine.checkpoint_engine.load = lambda p, map_location=None: torch.load(
            p, map_location=map_location, weights_only=True, mmap=True
        )
        with warnings.catch_warnings(), guarded(trusted=False):
            warnings.simplefilter("ignore")
            engine.load_checkpoint(str(Path(str(path)).parent), tag=Path(str(path)).name)
        out["control_mapped"] = _mapped_files(Path(root))
        return out
    finally:
        cleanup_distributed()


@needs_proc_maps
@pytest.mark.multirank
@pytest.mark.timeout(180)
@pytest.mark.skipif(find_spec("deepspeed") is None, reason="needs the deepspeed extra")
def test_a_deepspeed_load_copies_the_moments_back_and_leaves_nothing_mapped(
    tmp_path: Path,
) -> None:
    (r,) = run_ranks(_deepspeed_worker, 1, args=(str(tmp_path),), timeout=150)
    assert r["restored"] and r["same_tensors"], r
    assert r["mapped"] == []
    assert any("optim_states" in name for name in r["control_mapped"]), r["control_mapped"]
