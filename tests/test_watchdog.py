"""Hangs that name the rank: debug mode, failing ranks, the stall watchdog, monitored barriers.

The multi-rank scenarios run this very file under ``torchrun`` (2 gloo ranks):
``python -m torch.distributed.run --nproc_per_node=2 tests/test_watchdog.py MODE``.
"""

from __future__ import annotations

import io
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dist_harness import run_script
from gpu_training import watchdog as wd
from gpu_training.stall_report import raised_state, stall_verdict
from gpu_training.watchdog import (
    EXIT_STALLED,
    StallWatchdog,
    debug_mode_enabled,
    enable_debug_mode,
    entry_point,
)

pytestmark = pytest.mark.serial  # limits in seconds: make test runs these alone

STALL_TIMEOUT = 2.0


def _scenario(mode: str) -> None:
    """One rank of a scenario (run by torchrun; see the module docstring)."""
    import torch
    import torch.distributed as dist

    from gpu_training.ddp import cleanup_distributed, init_distributed

    ctx = init_distributed()
    t = torch.ones(4)
    if mode == "mismatch":  # the ranks call different collectives
        dist.barrier()
        print(f"COLLECTIVE_AT {time.time():.3f}", flush=True)
        if ctx.rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
    elif mode == "raise":  # rank 1 raises while rank 0 waits in its next all_reduce
        for step in range(10_000):
            if ctx.rank == 1 and step == 3:
                print(f"RAISE_AT {time.time():.3f}", flush=True)
                raise ValueError("boom on rank 1")
            dist.all_reduce(t)
    elif mode == "stall":  # rank 1 stops making progress; rank 0 waits in all_reduce
        with StallWatchdog(STALL_TIMEOUT, ctx=ctx) as watchdog:
            for step in range(10_000):
                if ctx.rank == 1 and step == 3:
                    print(f"STALL_AT {time.time():.3f}", flush=True)
                    time.sleep(120)
                dist.all_reduce(t)
                watchdog.tick(step)
    elif mode == "mismatch-watched":  # different collectives, no debug mode: the watchdog
        with StallWatchdog(STALL_TIMEOUT, ctx=ctx) as watchdog:
            for step in range(3):
                dist.all_reduce(t)
                watchdog.tick(step)
            print(f"COLLECTIVE_AT {time.time():.3f}", flush=True)
            if ctx.rank == 0:
                dist.all_reduce(t)
            else:
                dist.broadcast(t, src=0)
            watchdog.tick()
    elif mode == "raise-stuck":  # rank 1 raises, then hangs before its teardown
        try:
            with StallWatchdog(STALL_TIMEOUT, ctx=ctx) as watchdog:
                for step in range(10_000):
                    if ctx.rank == 1 and step == 3:
                        print(f"RAISE_AT {time.time():.3f}", flush=True)
                        raise ValueError("boom on rank 1")
                    dist.all_reduce(t)
                    watchdog.tick(step)
        finally:
            if ctx.rank == 1:
                time.sleep(120)
    elif mode == "monitored":  # rank 1 arrives 3 s late at a 1 s monitored barrier
        if ctx.rank == 1:
            time.sleep(3)
        start = time.time()
        try:
            wd.monitored_barrier(timeout=1.0)
        except wd.StallError as err:
            print(f"MONITORED rank {ctx.rank} after {time.time() - start:.2f}s: {err}", flush=True)
            os._exit(3)
    cleanup_distributed()


def _run(mode: str, **env: str) -> tuple[str, int, float]:
    proc = run_script(Path(__file__), 2, [mode], timeout=90, env=env)
    return proc.stdout + proc.stderr, proc.returncode, time.time()


def _stamp(name: str, output: str) -> float:
    match = re.search(rf"{name} (\d+\.\d+)", output)
    assert match, f"no {name} in:\n{output[-3000:]}"
    return float(match[1])


def _root_cause(output: str) -> str:
    assert "Root Cause (first observed failure)" in output, output[-3000:]
    return output.split("Root Cause (first observed failure)", 1)[1]


# --- multi-rank scenarios ---------------------------------------------------------------------


@pytest.mark.multirank
def test_collective_mismatch_in_debug_mode_names_both_ranks_and_ops() -> None:
    output, rc, ended = _run("mismatch", GPU_TRAINING_DEBUG="1")
    assert rc != 0
    took = ended - _stamp("COLLECTIVE_AT", output)
    assert took <= 5.0, f"mismatch took {took:.1f}s to end the job"
    for needle in (
        "Rank 0 is running collective",
        "OpType=ALLREDUCE",
        "Rank 1 is running collective",
        "OpType=BROADCAST",
    ):
        assert needle in output, output[-3000:]
    assert "gpu-training: rank 0 failed: RuntimeError: Detected mismatch" in output


@pytest.mark.multirank
def test_rank_that_raises_is_reported_with_its_traceback() -> None:
    output, rc, ended = _run("raise")
    assert rc != 0
    took = ended - _stamp("RAISE_AT", output)
    assert took <= 10.0, f"the job took {took:.1f}s to end after rank 1 raised"
    root = _root_cause(output)
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root), root
    assert "Traceback (most recent call last)" in root and "in _scenario" in root
    assert "ValueError: boom on rank 1" in root
    assert "gpu-training: rank 1 failed: ValueError: boom on rank 1" in output


@pytest.mark.multirank
def test_stalled_rank_is_named_by_the_watchdog_within_timeout() -> None:
    output, rc, ended = _run("stall")
    assert rc != 0
    took = ended - _stamp("STALL_AT", output)
    assert took <= STALL_TIMEOUT + 5.0, f"the stall was reported after {took:.1f}s"
    verdicts = re.findall(r"gpu-training watchdog: stall detected by rank (\d): (.*)", output)
    # the watchdog of the rank that ends the job (rank 1, the root cause below) says it; the
    # other's may not, when torchrun stops it first (seen in 1 of 3 runs on a quiet machine)
    assert "1" in {r for r, _ in verdicts}, output[-3000:]
    for _, verdict in verdicts:
        assert verdict.startswith("rank 1 stalled at ") and "test_watchdog.py" in verdict
        assert "rank 0 waiting in all_reduce" in verdict
    # each watchdog that fired put its rank's Python stacks in the log (two threads each)
    fired = {r for r, _ in verdicts}
    assert all(f"Python stacks of rank {r}" in output for r in fired), output[-3000:]
    assert output.count("(most recent call first)") >= 2 * len(fired)
    root = _root_cause(output)
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root), root
    assert f"exitcode  : {EXIT_STALLED}" in root and "StallError" in root


@pytest.mark.multirank
def test_flight_recorder_names_the_collective_a_stalled_rank_never_entered() -> None:
    """With the recorder on (GPU_TRAINING_STALL_TIMEOUT set before the group, as `train
    --stall-timeout` does), the verdict adds which collective rank 1 never entered."""
    output, rc, ended = _run("stall", GPU_TRAINING_STALL_TIMEOUT=str(STALL_TIMEOUT))
    assert rc != 0
    took = ended - _stamp("STALL_AT", output)
    assert took <= STALL_TIMEOUT + 5.0, f"the stall was reported after {took:.1f}s"
    seen = re.findall(r"flight recorder: (rank 1 never entered all_reduce #(\d+) .*)", output)
    assert seen, output[-3000:]
    text, number = seen[0]
    assert f"(its last: all_reduce #{int(number) - 1}): it is at " in text
    assert "test_watchdog.py" in text


@pytest.mark.multirank
def test_flight_recorder_names_a_collective_mismatch_without_debug_mode() -> None:
    """all_reduce on rank 0, broadcast on rank 1, no debug mode: both wait; the watchdog
    fires and the ranks' flight recorders show the two operations at the same number."""
    output, rc, ended = _run("mismatch-watched", GPU_TRAINING_STALL_TIMEOUT=str(STALL_TIMEOUT))
    assert rc != 0
    took = ended - _stamp("COLLECTIVE_AT", output)
    assert took <= STALL_TIMEOUT + 5.0, f"the mismatch was reported after {took:.1f}s"
    verdicts = re.findall(
        r"gpu-training watchdog: stall detected by rank (\d): .*flight recorder: a collective "
        r"mismatch at #\d+ of default_pg: rank 0 in all_reduce, rank 1 in broadcast",
        output,
    )
    # the first rank's watchdog to end the job says it (torchrun may stop the other first)
    assert verdicts, output[-3000:]


@pytest.mark.multirank
def test_watchdog_tells_a_rank_that_raised_from_a_stuck_one() -> None:
    output, rc, ended = _run("raise-stuck")
    assert rc != 0
    took = ended - _stamp("RAISE_AT", output)
    assert took <= STALL_TIMEOUT + 5.0, f"reported after {took:.1f}s"
    verdict = re.search(r"gpu-training watchdog: stall detected by rank 0: (.*)", output)
    assert verdict, output[-3000:]
    assert verdict[1].startswith("rank 1 raised ValueError: boom on rank 1 at "), verdict[1]
    assert "it is not stuck" in verdict[1] and "did not answer" not in verdict[1]
    root = _root_cause(output)  # its own exception, recorded as it left the loop
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root), root
    assert "ValueError: boom on rank 1" in root and "Signal 15" not in root


@pytest.mark.multirank
def test_monitored_barrier_names_the_missing_rank() -> None:
    output, rc, _ = _run("monitored")
    assert rc != 0
    match = re.search(r"MONITORED rank 0 after (\d+\.\d+)s: (.*)", output)
    assert match, output[-3000:]
    assert float(match[1]) < 2.5
    assert "Ranks 1 failed to pass monitoredBarrier" in match[2]


# --- in one process ---------------------------------------------------------------------------


def test_watchdog_fires_once_with_the_busy_frame() -> None:
    reports: list[wd.StallReport] = []
    stream = io.StringIO()
    with StallWatchdog(0.3, exit=False, on_stall=reports.append, stream=stream) as watchdog:
        for step in range(5):
            watchdog.tick(step)
            time.sleep(0.05)
        time.sleep(1.0)  # stalls here
    assert len(reports) == 1
    report = reports[0]
    assert report.culprits == [0] and report.last_step == 4
    assert report.stalled_for >= 0.3
    where = report.states[0]["where"]
    assert report.states[0]["state"] == "busy" and "test_watchdog.py" in where, where
    text = stream.getvalue()
    assert "rank 0 made no step progress" in text and "rank 0 stalled at" in text
    assert "test_watchdog_fires_once_with_the_busy_frame" in text  # the stack dump


def test_watchdog_quiet_while_ticking_and_disabled_without_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fired: list[wd.StallReport] = []
    with StallWatchdog(0.4, exit=False, on_stall=fired.append, quiet=True) as watchdog:
        for step in range(12):
            time.sleep(0.05)
            watchdog.tick(step)
    assert fired == []
    monkeypatch.delenv(wd.STALL_TIMEOUT_ENV, raising=False)
    off = StallWatchdog.from_env()
    assert not off.enabled and off.start()._thread is None
    monkeypatch.setenv(wd.STALL_TIMEOUT_ENV, "90")
    assert StallWatchdog.from_env().timeout == 90.0
    monkeypatch.setenv(wd.STALL_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="GPU_TRAINING_STALL_TIMEOUT must be a number"):
        StallWatchdog.from_env()


def test_startup_timeout_applies_until_the_first_tick() -> None:
    fired: list[wd.StallReport] = []
    watchdog = StallWatchdog(
        0.2, startup_timeout=5.0, exit=False, on_stall=fired.append, quiet=True
    )
    with watchdog:
        time.sleep(0.6)  # slower than timeout, within startup_timeout
    assert fired == []


def test_verdicts() -> None:
    states = {
        0: {"state": "collective", "op": "all_reduce", "where": "train.py:10 in main"},
        1: {"state": "collective", "op": "broadcast", "where": "train.py:12 in main"},
    }
    culprits, text = stall_verdict(states, 2, 30)
    assert culprits == [] and "different collectives" in text
    assert "rank 0 waiting in all_reduce" in text and "rank 1 waiting in broadcast" in text
    culprits, text = stall_verdict({0: states[0]}, 3, 30)
    assert culprits == [1, 2] and "did not answer" in text
    raised = {"state": "raised", "op": "ValueError: bad batch", "where": "data.py:7 in load"}
    culprits, text = stall_verdict({0: states[0], 1: raised}, 2, 30)
    assert culprits == [1]
    assert text.startswith("rank 1 raised ValueError: bad batch at data.py:7 in load")
    assert "rank 0 waiting in all_reduce" in text


def test_raised_state_points_at_the_programs_frame() -> None:
    def load() -> None:
        raise ValueError("bad batch")

    try:
        load()
    except ValueError as exc:
        state = raised_state(exc)
    assert state["state"] == "raised" and state["op"] == "ValueError: bad batch"
    assert state["where"].endswith("in load") and "test_watchdog.py" in state["where"]


@pytest.fixture
def torch_debug_level() -> Iterator[None]:
    """Restore torch's own debug level (read from the environment once, kept in C++)."""
    import torch.distributed as dist

    level = dist.get_debug_level()
    yield
    # DETAIL left on would wrap later in-process groups, and their DDP models would segfault
    dist.set_debug_level(level)


@pytest.mark.usefixtures("torch_debug_level")
@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")
def test_debug_mode_and_entry_point(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env: dict[str, str] = {"NCCL_DEBUG": "INFO"}
    previous = enable_debug_mode(env)
    assert env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL" and env["NCCL_DEBUG"] == "INFO"
    assert previous["TORCH_DISTRIBUTED_DEBUG"] is None and debug_mode_enabled(env)
    assert not debug_mode_enabled({"GPU_TRAINING_DEBUG": "0"})

    @entry_point
    def main(fail: bool) -> str:
        if fail:
            raise KeyError("missing")
        return "done"

    monkeypatch.setenv("RANK", "3")
    assert main(False) == "done"
    with pytest.raises(KeyError):
        main(True)
    assert "gpu-training: rank 3 failed: KeyError: 'missing'" in capsys.readouterr().err
    monkeypatch.setenv("GPU_TRAINING_DEBUG", "1")
    main(False)
    assert os.environ["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"  # restored by the env fixture


if __name__ == "__main__":
    entry_point(_scenario)(sys.argv[1])
