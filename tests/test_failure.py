"""gpu_training.failure: telling a failing rank from a finishing one, and ending it fast."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from dist_harness import run_python
from gpu_training.failure import (
    exception_in_flight,
    is_peer_failure,
    one_line,
    record_failure,
    write_error_record,
)

pytestmark = pytest.mark.serial  # limits in seconds: make test runs these alone

_GLOO_PEER_GONE = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:2720. This is typically caused by a remote worker crashing."
)


# --- exception_in_flight: the exact places teardown code runs ---------------------------------


def _seen_in_finally(fail: BaseException | None) -> BaseException | None:
    seen: list[BaseException | None] = []
    try:
        try:
            if fail is not None:
                raise fail
        finally:
            seen.append(exception_in_flight())  # GT015's `finally: cleanup_distributed()`
    except BaseException:
        pass
    return seen[0]


def test_in_flight_in_finally_except_and_exit() -> None:
    boom = RuntimeError("boom")
    assert _seen_in_finally(boom) is boom
    assert _seen_in_finally(None) is None
    assert isinstance(_seen_in_finally(KeyboardInterrupt()), KeyboardInterrupt)
    assert isinstance(_seen_in_finally(SystemExit(2)), SystemExit)
    assert _seen_in_finally(SystemExit(0)) is None and _seen_in_finally(SystemExit()) is None

    class Probe:
        seen: BaseException | None = None

        def __enter__(self) -> Probe:
            return self

        def __exit__(self, *exc: object) -> bool:
            Probe.seen = exception_in_flight()
            return True

    with Probe():
        raise ValueError("in a with block")
    assert isinstance(Probe.seen, ValueError)
    try:
        raise KeyError("handled")
    except KeyError:
        pass
    assert exception_in_flight() is None  # a handled exception is over once its block ends


# --- victims and culprits ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "rank", "victim"),
    [
        (_GLOO_PEER_GONE, 0, True),
        ("[pair.cc:537] Read error [127.0.0.1]:3797: Connection reset by peer", 0, True),
        ("NCCL error: remote process exited or there was a network error", 3, True),
        ("could not save step 2 to ck: rank 1: RuntimeError: disk full", 0, True),
        ("could not save step 2 to ck: rank 1: RuntimeError: disk full", 1, False),
        (
            "Detected mismatch: Rank 0 is running ALLREDUCE, but Rank 1 is running BROADCAST",
            1,
            False,
        ),
        ("planted fault on rank 1 at step 10", 1, False),
        ("CUDA out of memory", 0, False),
    ],
)
def test_is_peer_failure(message: str, rank: int, victim: bool) -> None:
    assert is_peer_failure(RuntimeError(message), rank=rank) is victim


def test_peer_failure_is_found_in_the_chain() -> None:
    try:
        try:
            raise RuntimeError(_GLOO_PEER_GONE)
        except RuntimeError as err:
            raise ValueError("step failed") from err
    except ValueError as exc:
        assert is_peer_failure(exc, rank=0)


# torch 2.13's words when rank 1 broadcasts while rank 0 reduces (TORCH_DISTRIBUTED_DEBUG=DETAIL,
# gloo), inside our checkpoint error: the fault matrix's mismatch-zero2-save cell printed it.
_MISMATCH = (
    "Detected mismatch between collectives on ranks. Rank 1 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=15, OpType=BROADCAST, TensorShape=[3], "
    "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, "
    "layout=Strided (default), requires_grad=false (default), pinned_memory=false (default), "
    "memory_format=(nullopt))), but Rank 0 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=0OpType=REDUCE).Collectives differ in the following "
    "aspects: \t Sequence number: 15vs 0  Op type: BROADCASTvs REDUCE  Tensor Tensor shapes: "
    "3vs   Tensor Tensor dtypes: Floatvs   Tensor Tensor devices: TensorOptions(dtype=float "
    "(default), device=cpu, layout=Strided (default), requires_grad=false (default), "
    "pinned_memory=false (default), memory_format=(nullopt))vs "
)


def test_one_line_keeps_both_ranks_of_a_collective_mismatch() -> None:
    from gpu_training.checkpoint import CheckpointError

    path = "/scratch/runs/a-run-with-a-long-name/checkpoints"
    exc = CheckpointError(f"could not save step 2 to {path}: rank 1: RuntimeError: {_MISMATCH}")
    assert len(str(exc)) > 800
    for limit in (500, 300):  # the failed rank's line; the stall report's note
        line = one_line(exc if limit == 500 else RuntimeError(_MISMATCH), limit=limit)
        assert len(line) <= limit and "\n" not in line and "\t" not in line
        assert "OpType=BROADCAST, TensorShape=[3], TensorDtypes=Float)" in line, line
        assert "but Rank 0 is running collective: CollectiveFingerPrint(" in line, line
        assert "OpType=REDUCE" in line, line
        assert line.endswith("..."), line
    assert one_line(ValueError("short")) == "ValueError: short"


def test_record_post_dates_a_victim_and_keeps_the_first_date(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setenv("RANK", "0")
    now = 1_000_000.7
    try:
        raise RuntimeError("planted fault")
    except RuntimeError as raised:
        culprit = raised
    assert record_failure(culprit, now=now)
    data = json.loads(path.read_text())["message"]
    assert data["message"] == "RuntimeError: planted fault"
    assert data["extraInfo"]["timestamp"] == "1000000"
    assert "Traceback" in data["extraInfo"]["py_callstack"]
    assert record_failure(culprit, now=now + 30)  # written again: same date
    assert json.loads(path.read_text())["message"]["extraInfo"]["timestamp"] == "1000000"
    victim = RuntimeError(_GLOO_PEER_GONE)
    assert record_failure(victim, now=now)
    data = json.loads(path.read_text())["message"]
    assert data["extraInfo"]["timestamp"] == "1000002"  # torchrun's root cause: never this one
    assert data["extraInfo"]["py_callstack"].startswith("rank 0 stopped: another rank failed")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE")
    assert not record_failure(culprit)  # not under torchrun: nothing to write


def test_error_record_is_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text("{}")
    assert write_error_record(str(path), {"message": "x"})
    assert json.loads(path.read_text()) == {"message": "x"}
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]  # no temporary left
    assert not write_error_record(str(tmp_path / "missing" / "error.json"), {})


# --- ending a process ---------------------------------------------------------------------------

_STUCK = """
import json, os, sys, threading, time
from gpu_training.failure import exit_if_stuck
try:
    raise RuntimeError("boom on rank 3")
except RuntimeError as exc:
    start = time.monotonic()
    with exit_if_stuck(exc, timeout=0.5):
        time.sleep(30)  # a teardown that never returns
print("not reached")
"""

_END_FAILED = """
import multiprocessing, os, sys, time
from gpu_training.failure import end_failed_rank
child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
child.start()
print("child", child.pid, flush=True)
try:
    raise RuntimeError(sys.argv[1])
except RuntimeError as exc:
    end_failed_rank(exc)
"""


def test_a_stuck_teardown_is_reported_and_the_process_ends(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    env = {"RANK": "3", "TORCHELASTIC_ERROR_FILE": str(error_file)}
    started = time.monotonic()
    proc = run_python(["-c", _STUCK], timeout=30, env=env)
    assert time.monotonic() - started < 15
    assert proc.returncode == 1 and "not reached" not in proc.stdout
    assert "[rank3]: RuntimeError: boom on rank 3" in proc.stderr
    assert "tearing down its process group took more than 0.5s" in proc.stderr
    assert (
        json.loads(error_file.read_text())["message"]["message"] == "RuntimeError: boom on rank 3"
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("victim", [False, True])
def test_end_failed_rank_prints_the_culprits_traceback_and_stops_its_children(
    victim: bool,
) -> None:
    message = _GLOO_PEER_GONE if victim else "planted fault"
    proc = run_python(["-c", _END_FAILED, message], timeout=30, env={"RANK": "1"})
    assert proc.returncode == 1
    assert ("Traceback" in proc.stderr) is not victim  # a victim's line was printed before
    pid = int(proc.stdout.split()[1])
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}").exists() else ""
        if ") Z" in stat:
            break
        time.sleep(0.05)
    gone = not Path(f"/proc/{pid}").exists() or ") Z" in Path(f"/proc/{pid}/stat").read_text()
    assert gone, "the child (a DataLoader worker) outlived its rank"
