"""Tests for asynchronous checkpoint saves and for saves that hit a full disk.

The writer is held on a gate (an Event the patched ``torch.save`` waits on), so "save()
returned before the write" and "the next save waited" are facts the tests observe, not
timings they guess.
"""

from __future__ import annotations

import json
import re
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from dist_harness import run_python, run_ranks
from gpu_training.checkpoint import (
    STATE_NAME,
    CheckpointError,
    CheckpointManager,
    snapshot_state,
)
from gpu_training.ddp import DistributedContext

SINGLE = DistributedContext()
_REAL_SAVE = torch.save


def _model_state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 1}


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


def _assert_same(a: Any, b: Any, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


class _GatedSave:
    """Stands in for torch.save: logs start/end per call, holds chosen calls on a gate."""

    def __init__(self, hold: int = 0, fail_on: tuple[int, ...] = ()) -> None:
        self.gate = threading.Event()
        self.hold = hold  # this many first calls wait for the gate
        self.fail_on = fail_on  # 1-based call numbers that fail like a full disk
        self.log: list[str] = []
        self.calls = 0
        self.started = threading.Event()

    def __call__(self, obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        call = self.calls
        self.log.append(f"start{call}")
        self.started.set()
        if call <= self.hold:
            assert self.gate.wait(30), "gate never opened"
        if call in self.fail_on:
            self.log.append(f"fail{call}")
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 9 vs 3")
        _REAL_SAVE(obj, f, *args, **kwargs)
        self.log.append(f"end{call}")


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[_GatedSave]:
    fake = _GatedSave(hold=1)
    monkeypatch.setattr(torch, "save", fake)
    yield fake
    fake.gate.set()  # never leave a writer thread blocked


def _manager(path: Path, keep_last_n: int | None = 3) -> CheckpointManager:
    return CheckpointManager(path, ctx=SINGLE, keep_last_n=keep_last_n)


# --- the snapshot --------------------------------------------------------------------------


def test_snapshot_copies_tensors_and_keeps_structure_and_sharing() -> None:
    model = nn.Linear(4, 4)
    sd = model.state_dict()
    state = {
        "model": sd,
        "tied": {"a": model.weight, "b": model.weight, "row": model.weight[1]},
        "list": [torch.ones(2), (torch.zeros(1), 3)],
        "extra": {"names": ["x"], "size": torch.Size([2, 3]), "dtype": torch.float16},
    }
    snap = snapshot_state(state)
    _assert_same(snap["model"], dict(sd))
    assert type(snap["model"]) is type(sd) and snap["model"]._metadata == sd._metadata
    assert snap["model"]._metadata is not sd._metadata
    tied = snap["tied"]
    assert type(tied["a"]) is nn.Parameter and tied["a"].requires_grad  # as torch.save keeps it
    assert tied["a"].grad_fn is None and type(tied["row"]) is torch.Tensor
    assert tied["a"].untyped_storage().data_ptr() == tied["b"].untyped_storage().data_ptr()
    assert tied["row"].untyped_storage().data_ptr() == tied["a"].untyped_storage().data_ptr()
    assert torch.equal(tied["row"], model.weight[1])
    assert snap["extra"]["size"] == torch.Size([2, 3]) and snap["extra"]["dtype"] is torch.float16
    assert snap["extra"]["names"] is not state["extra"]["names"]
    for copied, original in ((snap["list"][0], state["list"][0]), (tied["a"], model.weight)):
        assert copied.untyped_storage().data_ptr() != original.untyped_storage().data_ptr()
    with torch.no_grad():
        model.weight.add_(1.0)
    state["list"][0].add_(1.0)
    state["extra"]["names"].append("y")
    assert torch.equal(tied["b"] + 1.0, model.weight) and torch.equal(
        snap["list"][0], torch.ones(2)
    )
    assert snap["extra"]["names"] == ["x"]


@pytest.mark.requires_cuda
def test_snapshot_of_cuda_tensors_lands_in_pinned_cpu_memory() -> None:
    weight = torch.randn(256, 256, device="cuda")
    view = weight[3:7]
    snap = snapshot_state({"w": weight, "v": view, "cpu": torch.ones(3)})
    assert snap["w"].device.type == "cpu" and snap["w"].is_pinned()
    assert torch.equal(snap["w"], weight.cpu()) and torch.equal(snap["v"], view.cpu())
    assert snap["v"].untyped_storage().data_ptr() == snap["w"].untyped_storage().data_ptr()
    weight.add_(1.0)  # on the GPU, after the snapshot returned
    torch.cuda.synchronize()
    assert not torch.equal(snap["w"], weight.cpu())
    assert not snap["cpu"].is_pinned()


def _zip_members(path: Path) -> dict[str, bytes]:
    # torch's own reader: the writers leave the zip CRC32 empty (zipfile would refuse it);
    # each torch.save draws a new serialization_id
    reader = torch._C.PyTorchFileReader(str(path))
    return {
        n: reader.get_record(n) for n in reader.get_all_records() if "serialization_id" not in n
    }


def test_async_writes_the_same_bytes_as_a_sync_save(tmp_path: Path) -> None:
    state = _model_state()
    lin = nn.Linear(3, 3)
    state["tied"] = [lin.weight, lin.weight, lin.weight[0]]  # Parameters and a view, shared
    ckpt = _manager(tmp_path, keep_last_n=None)
    sync_path = ckpt.save(state, step=1)
    async_path = ckpt.save(state, step=2, async_save=True)
    assert async_path == tmp_path / "step-00000002"
    assert ckpt.wait() == async_path
    assert sync_path is not None
    sync_members = _zip_members(sync_path / STATE_NAME)
    assert len(sync_members) > 5 and sync_members == _zip_members(async_path / STATE_NAME)
    loaded = ckpt.load(2)
    assert loaded["tied"][0].data_ptr() == loaded["tied"][1].data_ptr()  # still tied
    _assert_same(loaded, ckpt.load(1))


# --- blocking, ordering, errors -----------------------------------------------------------------


def test_async_save_returns_before_the_write_and_saves_the_old_values(
    tmp_path: Path, gated: _GatedSave
) -> None:
    state = _model_state()
    expected = _clone(state)
    ckpt = _manager(tmp_path)
    path = ckpt.save(state, step=10, async_save=True)
    assert path == tmp_path / "step-00000010"
    assert gated.started.wait(10) and gated.log == ["start1"]  # the writer is held...
    assert ckpt.pending and ckpt.latest() is None  # ...and save() has returned anyway
    # training goes on and changes everything in place
    for tensor in state["model"].values():
        tensor.add_(100.0)
    for slot in state["optimizer"]["state"].values():
        slot["exp_avg"].mul_(-1.0)
    state["epoch"] = 2
    gated.gate.set()
    assert ckpt.wait() == path
    assert not ckpt.pending and ckpt.wait() is None
    _assert_same(ckpt.load(10), expected)


def test_consecutive_async_saves_refill_the_host_buffers_safely(tmp_path: Path) -> None:
    ckpt = _manager(tmp_path, keep_last_n=None)
    x = torch.arange(1000.0)
    states = [{"x": x + step, "y": torch.full((7,), step)} for step in range(3)]
    states.append({"x": torch.ones(10), "y": torch.zeros(7, dtype=torch.int64)})  # new shapes
    pointers = []
    for step, state in enumerate(states):
        ckpt.save(state, step=step, async_save=True)
        pointers.append({s.data_ptr() for group in ckpt._plain._staging.values() for s in group})
    ckpt.close()
    assert pointers[1] == pointers[0] and pointers[2] == pointers[0]  # the same buffers...
    assert len(pointers[3] & pointers[0]) == 1  # ...but only where the sizes still match
    assert ckpt._plain._staging == {}  # close() lets them go
    for step, state in enumerate(states):
        _assert_same(ckpt.load(step), state)  # each write was over before its buffers refilled


@pytest.mark.parametrize("second", ["sync", "async"])
def test_second_save_waits_for_the_pending_one(
    tmp_path: Path, gated: _GatedSave, second: str
) -> None:
    ckpt = _manager(tmp_path, keep_last_n=None)
    ckpt.save({"x": torch.full((4,), 1.0)}, step=1, async_save=True)
    assert gated.started.wait(10)
    opened = threading.Timer(0.3, gated.gate.set)
    opened.start()
    try:
        begun = time.monotonic()
        ckpt.save({"x": torch.full((4,), 2.0)}, step=2, async_save=second == "async")
        assert time.monotonic() - begun >= 0.25  # it blocked until the first write was let go
        ckpt.wait()
    finally:
        opened.cancel()
    assert gated.log == ["start1", "end1", "start2", "end2"]  # one write at a time, in order
    assert [p.name for p in ckpt.list_checkpoints()] == ["step-00000001", "step-00000002"]
    assert torch.equal(ckpt.load(1)["x"], torch.full((4,), 1.0))


@pytest.mark.parametrize("where", ["save", "wait", "close", "with"])
def test_background_error_is_raised_at_the_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    ckpt = _manager(tmp_path, keep_last_n=1)
    ckpt.save({"x": torch.ones(3)}, step=1)
    before = (tmp_path / "step-00000001" / STATE_NAME).read_bytes()
    fake = _GatedSave(fail_on=(1,))
    monkeypatch.setattr(torch, "save", fake)
    with pytest.raises(CheckpointError, match=r"step 2 .*unexpected pos.*disk full") as err:
        if where == "with":
            with ckpt:
                ckpt.save({"x": torch.zeros(3)}, step=2, async_save=True)
        else:
            assert ckpt.save({"x": torch.zeros(3)}, step=2, async_save=True) is not None
            if where == "save":
                ckpt.save({"x": torch.full((3,), 3.0)}, step=3)
            else:
                getattr(ckpt, where)()
    assert isinstance(err.value.__cause__, RuntimeError)
    assert fake.log == ["start1", "fail1"]  # the save that raised did not start a write
    assert not ckpt.pending
    assert ckpt.wait() is None  # reported once
    assert [p.name for p in ckpt.list_checkpoints()] == ["step-00000001"]  # nothing pruned
    assert (tmp_path / "step-00000001" / STATE_NAME).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001"]  # no .tmp-*
    monkeypatch.undo()
    assert ckpt.save({"x": torch.full((3,), 3.0)}, step=3, async_save=True) is not None
    ckpt.close()
    assert [p.name for p in ckpt.list_checkpoints()] == ["step-00000003"]


def test_exception_in_with_block_is_not_masked_by_a_failed_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch, "save", _GatedSave(fail_on=(1,)))
    ckpt = _manager(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyError, match="training broke"), ckpt:
            ckpt.save({"x": torch.ones(1)}, step=4, async_save=True)
            raise KeyError("training broke")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any(re.search(r"step 4 was not saved.*unexpected pos", m) for m in messages), messages
    assert not ckpt.pending


def test_bad_arguments_raise_at_once_and_keep_the_pending_save(
    tmp_path: Path, gated: _GatedSave
) -> None:
    ckpt = _manager(tmp_path)
    ckpt.save({"x": torch.ones(1)}, step=1, async_save=True)
    with pytest.raises(ValueError, match="step"):
        ckpt.save({"x": torch.ones(1)}, step=-1, async_save=True)
    with pytest.raises(TypeError, match="mapping"):
        ckpt.save([torch.ones(1)], step=2, async_save=True)  # type: ignore[arg-type]
    assert ckpt.pending
    gated.gate.set()
    assert ckpt.wait() == tmp_path / "step-00000001"


_EXIT_SCRIPT = """
import sys, time, torch
from gpu_training.checkpoint import CheckpointManager
from gpu_training.ddp import DistributedContext
real = torch.save
def slow(obj, f, *a, **k):
    time.sleep(0.5)
    if sys.argv[2] == "fail":
        raise OSError(28, "No space left on device")
    real(obj, f, *a, **k)
torch.save = slow
ckpt = CheckpointManager(sys.argv[1], ctx=DistributedContext())
ckpt.save({"x": torch.arange(5.0)}, step=7, async_save=True)
print("returned", flush=True)  # and the interpreter exits with the write still going
"""


@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_interpreter_exit_completes_a_pending_save(tmp_path: Path, mode: str) -> None:
    proc = run_python(["-c", _EXIT_SCRIPT, str(tmp_path), mode], timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "returned", proc.stderr
    ckpt = _manager(tmp_path)
    if mode == "ok":
        assert torch.equal(ckpt.load(7)["x"], torch.arange(5.0))
        assert "not saved" not in proc.stderr
    else:
        assert ckpt.list_checkpoints() == []
        assert "step 7 was not saved" in proc.stderr and "No space left" in proc.stderr
    assert not list(tmp_path.glob(".tmp-*"))


# --- several ranks -----------------------------------------------------------------------------


def _async_worker(directory: str) -> dict[str, Any]:
    from gpu_training.ddp import cleanup_distributed, init_distributed

    ctx = init_distributed()
    out: dict[str, Any] = {}
    try:
        real_save = torch.save
        calls: list[int] = []

        def slow_then_fail(obj: Any, f: Any, *a: Any, **k: Any) -> None:
            calls.append(1)
            time.sleep(1.5)  # the other rank must not wait for this
            if len(calls) == 2:
                raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos")
            real_save(obj, f, *a, **k)

        if ctx.rank == 0:
            torch.save = slow_then_fail
        ckpt = CheckpointManager(directory, ctx=ctx, keep_last_n=5)
        mine = {"x": torch.full((4,), float(ctx.rank + 1))}
        begun = time.monotonic()
        path = ckpt.save(mine, step=1, async_save=True)
        out["returned_s"] = time.monotonic() - begun
        out["path"] = None if path is None else str(path)
        out["seen_before_wait"] = [p.name for p in ckpt.list_checkpoints()]
        out["pending"] = ckpt.pending
        waited = ckpt.wait()
        out["waited"] = None if waited is None else str(waited)
        out["seen_after_wait"] = [p.name for p in ckpt.list_checkpoints()]

        ckpt.save(mine, step=2, async_save=True)  # rank 0's write of this one fails
        try:
            ckpt.save(mine, step=3)
            out["error"] = None
        except CheckpointError as exc:
            out["error"] = str(exc)
        torch.save = real_save
        with ckpt:
            ckpt.save(mine, step=3, async_save=True)
        out["steps"] = [p.name for p in ckpt.list_checkpoints()]
        out["loaded"] = ckpt.load()["x"].tolist()
    finally:
        cleanup_distributed()
    return out


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.serial
def test_two_ranks_async_save_and_error_reaches_every_rank(tmp_path: Path) -> None:
    r0, r1 = run_ranks(_async_worker, 2, args=(str(tmp_path),), timeout=90)
    assert r0["path"] == r0["waited"] == str(tmp_path / "step-00000001")
    assert r1["path"] is None and r1["waited"] is None
    for r in (r0, r1):
        assert r["returned_s"] < 1.0  # nobody waited for rank 0's 1.5 s write
        assert r["pending"] is True
        assert r["seen_before_wait"] == []
        assert r["seen_after_wait"] == ["step-00000001"]  # wait() is a barrier after the commit
        assert r["error"] is not None and "step 2" in r["error"] and "unexpected pos" in r["error"]
        assert r["steps"] == ["step-00000001", "step-00000003"]
        assert r["loaded"] == [1.0] * 4  # rank 0's state
    assert r1["error"].startswith("rank 0 failed to save step 2")
    assert not list(tmp_path.glob(".tmp-*"))


# --- a full disk: RLIMIT_FSIZE makes write() fail with EFBIG ----------------------------------

_DISK_FULL_SCRIPT = """
import json, resource, signal, sys, torch
from gpu_training.checkpoint import CheckpointError, CheckpointManager
from gpu_training.ddp import DistributedContext

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us instead of EFBIG
limit = 256 * 1024
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
results = {}
for mode in ("sync", "async"):
    ckpt = CheckpointManager(f"{sys.argv[1]}/{mode}", ctx=DistributedContext(), keep_last_n=2)
    for step in (1, 2):
        ckpt.save({"x": torch.full((1000,), float(step)), "step": step}, step=step)
    big = {"x": torch.randn(1_000_000), "step": 3}  # 4 MB > the limit
    out = results[mode] = {"error": None}
    try:
        if mode == "async":
            out["returned"] = str(ckpt.save(big, step=3, async_save=True))
            ckpt.wait()
        else:
            ckpt.save(big, step=3)
    except CheckpointError as exc:
        out["error"] = str(exc)
        out["cause"] = repr(exc.__cause__)
        out["torch_said"] = repr(exc.__cause__.__cause__)
print(json.dumps(results))
"""


def test_file_size_limit_fails_cleanly_and_keeps_previous(tmp_path: Path) -> None:
    proc = run_python(["-c", _DISK_FULL_SCRIPT, str(tmp_path)], timeout=90)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for mode in ("sync", "async"):
        out, directory = results[mode], tmp_path / mode
        assert out["error"] is not None, (mode, out)
        assert out["error"].startswith(f"could not save step 3 to {directory}: OSError:")
        assert "File too large" in out["error"] and "ulimit -f" in out["error"]
        assert out["cause"] == "OSError(27, 'File too large')"  # the real error, not torch's
        assert "unexpected pos" in out["torch_said"]  # which is kept as its cause
        if mode == "async":
            assert out["returned"] == str(directory / "step-00000003")
        # no temporary directory left, nothing pruned, the previous ones intact
        assert sorted(p.name for p in directory.iterdir()) == ["step-00000001", "step-00000002"]
        ckpt = _manager(directory)
        for step in (1, 2):
            assert ckpt.verify(step) == []
            _assert_same(ckpt.load(step), {"x": torch.full((1000,), float(step)), "step": step})
