"""Tests for the multi-rank harness (dist_harness.py) and the hermetic fixtures (conftest.py).

The rank functions live at module level so the harness's workers can import them by name;
they import torch lazily so a rank that needs no torch starts in a fraction of a second.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from dist_harness import run_python, run_ranks, run_script

TESTS_DIR = Path(__file__).resolve().parent


def _rank() -> int:
    return int(os.environ["RANK"])


def _alive(pid: int) -> bool:
    """True if ``pid`` runs; an unreaped zombie counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return not Path("/proc").is_dir()  # gone since os.kill, or no /proc to ask
    return state != "Z"


def _survivors(pids: list[int], within: float = 5.0) -> list[int]:
    """The pids still alive after waiting up to ``within`` seconds for SIGKILL to land."""
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


# --- rank functions (run inside the harness's workers) -------------------------------------


def _parent_pid() -> int:
    return os.getppid()


def _exit_work(marker_dir: str) -> int:
    """Leaves a non-daemon thread and an atexit handler: both must finish as the rank ends."""
    import atexit
    import threading

    marker = Path(marker_dir) / f"rank{_rank()}"

    def late() -> None:
        time.sleep(0.3)
        marker.with_suffix(".thread").write_text("joined")

    threading.Thread(target=late).start()
    atexit.register(lambda: marker.with_suffix(".atexit").write_text("ran"))
    return _rank()


def _allreduce_rank(scale: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="gloo")
    total = torch.tensor([scale * (dist.get_rank() + 1)])
    dist.all_reduce(total)
    out = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "sum": total.item(),
        "env": {k: os.environ[k] for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")},
        "omp": os.environ["OMP_NUM_THREADS"],
        "extra": os.environ.get("HARNESS_EXTRA"),
        "pid": os.getpid(),
        "pgid": os.getpgrp(),
    }
    dist.barrier()  # without it gloo often aborts at exit
    dist.destroy_process_group()
    return out


def _raise_on_rank1() -> int:
    if _rank() == 1:
        raise ValueError("boom on rank 1")
    import torch.distributed as dist

    dist.init_process_group(backend="gloo")  # waits for rank 1, which never comes
    return 0


def _sleep_forever(pid_dir: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(pid_dir, f"rank{_rank()}.pids").write_text(f"{os.getpid()} {child.pid}")
    print(f"rank {_rank()} going to sleep")
    time.sleep(600)


def _result_then_crash(how: str) -> int:
    import atexit
    import ctypes

    if _rank() == 1:  # runs after the worker has written rank1.pkl
        crash = {
            "abort": os.abort,
            "segv": lambda: ctypes.string_at(0),
            "exit3": lambda: os._exit(3),
        }
        atexit.register(crash[how])
    return _rank()


def _abort_on_rank1() -> int:
    if _rank() == 1:
        os.abort()
    return _rank()


def _eaddrinuse_once(marker_dir: str) -> str:
    marker = Path(marker_dir, f"rank{_rank()}")
    if not marker.exists():
        marker.write_text(os.environ["MASTER_PORT"])
        raise OSError(errno.EADDRINUSE, "Address already in use")
    return os.environ["MASTER_PORT"]


def _eaddrinuse_always(marker_dir: str) -> None:
    with open(Path(marker_dir, f"rank{_rank()}"), "a") as f:
        f.write(os.environ["MASTER_PORT"] + "\n")
    raise OSError(errno.EADDRINUSE, "Address already in use")


# --- run_ranks ------------------------------------------------------------------------------


@pytest.mark.multirank
def test_run_ranks_returns_each_ranks_value_from_a_real_allreduce() -> None:
    results = run_ranks(_allreduce_rank, 2, args=(0.5,), timeout=60, env={"HARNESS_EXTRA": "x"})

    assert [r["rank"] for r in results] == [0, 1]
    assert [r["env"]["LOCAL_RANK"] for r in results] == ["0", "1"]
    for r in results:
        assert r["world_size"] == 2
        assert r["sum"] == pytest.approx(0.5 * (1 + 2))
        assert r["env"]["LOCAL_WORLD_SIZE"] == "2"
        assert r["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert (r["omp"], r["extra"]) == ("1", "x")
    assert len({r["pid"] for r in results} | {os.getpid()}) == 3
    assert results[0]["pgid"] == results[1]["pgid"] != os.getpgrp()


@pytest.mark.multirank
@pytest.mark.parametrize(
    ("how", "forked"),
    [
        ({}, True),
        ({"fresh": True}, False),
        ({"env": {"TORCH_SHOW_CPP_STACKTRACES": "0"}}, False),  # read when torch is imported
    ],
    ids=["zygote", "fresh", "import-time-variable"],
)
def test_ranks_come_from_the_zygote_unless_they_need_a_fresh_interpreter(
    how: dict[str, Any], forked: bool
) -> None:
    parents = run_ranks(_parent_pid, 2, **how)
    if forked:  # the forkserver's children, not this process's
        assert os.getpid() not in parents and len(set(parents)) == 1, parents
    else:
        assert parents == [os.getpid(), os.getpid()]


def test_fresh_ranks_env_variable_makes_every_call_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GT_TEST_FRESH_RANKS", "1")
    assert run_ranks(_parent_pid, 1) == [os.getpid()]


def test_a_forked_rank_joins_its_threads_and_runs_atexit_as_it_ends(tmp_path: Path) -> None:
    assert run_ranks(_exit_work, 2, args=(str(tmp_path),)) == [0, 1]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.thread").read_text() == "joined"
        assert (tmp_path / f"rank{rank}.atexit").read_text() == "ran"


@pytest.mark.serial
def test_run_ranks_names_the_rank_that_raised_and_stops_the_others_early() -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_ranks(_raise_on_rank1, 2, timeout=90)

    message = str(info.value)
    assert time.monotonic() - start < 30  # rank 0 waits forever in init unless killed
    first_line, _, rest = message.partition("\n")
    assert first_line == "run_ranks failed: rank 1 raised ValueError: boom on rank 1 (exit code 1)"
    assert 'raise ValueError("boom on rank 1")' in rest  # the rank's traceback
    assert "rank 0 had not finished" in message


@pytest.mark.multirank
@pytest.mark.serial
def test_run_ranks_timeout_kills_every_rank_and_their_children(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_ranks(_sleep_forever, 2, args=(str(tmp_path),), timeout=5)

    assert time.monotonic() - start < 15
    message = str(info.value)
    assert "timed out after 5s: ranks [0, 1] had not finished" in message
    assert "_sleep_forever" in message  # each hung rank's stack, dumped by faulthandler
    assert "rank 0 going to sleep" in message and "rank 1 going to sleep" in message
    pids = [int(p) for f in sorted(tmp_path.glob("rank*.pids")) for p in f.read_text().split()]
    assert len(pids) == 4
    assert _survivors(pids) == []


@pytest.mark.parametrize("how", ["abort", "segv"])
def test_run_ranks_tolerates_a_crash_at_exit_after_the_result(how: str) -> None:
    with pytest.warns(UserWarning, match="rank 1 crashed at exit"):
        assert run_ranks(_result_then_crash, 2, args=(how,), timeout=60) == [0, 1]


def test_run_ranks_fails_on_an_unknown_exit_code_after_the_result() -> None:
    with pytest.raises(AssertionError, match="rank 1 wrote its result but then exited with code 3"):
        run_ranks(_result_then_crash, 2, args=("exit3",), timeout=60)


def test_run_ranks_fails_on_a_crash_before_the_result() -> None:
    with pytest.raises(AssertionError) as info:
        run_ranks(_abort_on_rank1, 2, timeout=60)
    assert "rank 1 exited with code -6 without writing a result" in str(info.value)
    assert "Fatal Python error: Aborted" in str(info.value)  # the rank's output tail


def test_run_ranks_retries_once_with_a_fresh_port_on_eaddrinuse(tmp_path: Path) -> None:
    results = run_ranks(_eaddrinuse_once, 2, args=(str(tmp_path),), timeout=60)

    first_ports = {(tmp_path / f"rank{r}").read_text() for r in range(2)}
    assert len(first_ports) == 1
    assert results[0] == results[1] not in first_ports


def test_run_ranks_does_not_retry_a_port_more_than_once(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="Address already in use"):
        run_ranks(_eaddrinuse_always, 2, args=(str(tmp_path),), timeout=60)
    assert len((tmp_path / "rank0").read_text().split()) == 2


def test_run_ranks_rejects_functions_workers_cannot_import() -> None:
    def local() -> None:
        pass

    with pytest.raises(ValueError, match="module-level"):
        run_ranks(local, 2)
    with pytest.raises(ValueError, match="nprocs"):
        run_ranks(_rank, 0)


# --- run_script / run_python ----------------------------------------------------------------

_ALLREDUCE_SCRIPT = """
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {total.item()} args {sys.argv[1:]}")
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.multirank
def test_run_script_runs_torchrun_on_two_ranks_and_captures_output(tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(_ALLREDUCE_SCRIPT)

    proc = run_script(script, 2, ["--flag", "x"], timeout=120)

    assert proc.returncode == 0, proc.stderr
    for rank in range(2):
        assert f"rank {rank} of 2 sum 3.0 args ['--flag', 'x']" in proc.stdout


def test_run_script_reports_a_failing_script(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("raise RuntimeError('script failed on purpose')\n")

    proc = run_script(script, 1, timeout=120)

    assert proc.returncode != 0
    assert "script failed on purpose" in proc.stderr


def test_run_script_timeout_kills_torchrun_workers(tmp_path: Path) -> None:
    # torchrun puts each worker in its own session: killing torchrun's group is not enough.
    script = tmp_path / "hang.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "pathlib.Path(sys.argv[1], os.environ['RANK']).write_text(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(AssertionError, match="timed out after 8s"):
        run_script(script, 2, [str(tmp_path)], timeout=8)

    pids = [int((tmp_path / rank).read_text()) for rank in ("0", "1")]
    assert _survivors(pids) == []


def test_run_python_captures_output_and_kills_on_timeout(tmp_path: Path) -> None:
    proc = run_python(["-c", "import os, sys; print(os.environ['OMP_NUM_THREADS']); sys.exit(4)"])
    assert (proc.returncode, proc.stdout.strip()) == (4, "1")

    child = (
        "import os, subprocess, sys, time\n"
        "kid = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(600)'])\n"
        "print(os.getpid(), kid.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(AssertionError, match="timed out after 3s") as info:
        run_python(["-c", child], timeout=3)
    pids = [int(p) for p in str(info.value).split("--- stdout tail ---\n")[1].split()[:2]]
    assert _survivors(pids) == []


# --- conftest fixtures, exercised in an inner pytest run ------------------------------------

_INNER_TESTS = """
import os

import pytest
import torch.distributed as dist


def test_leaks_env():
    os.environ["GT_HARNESS_LEAK"] = "1"


def test_env_restored():
    assert "GT_HARNESS_LEAK" not in os.environ


def test_leaks_process_group(free_port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port}", rank=0, world_size=1)


def test_group_was_destroyed():
    assert not dist.is_initialized()


@pytest.mark.requires_gpus(1024)
def test_needs_many_gpus():
    raise AssertionError("must have been skipped")


@pytest.mark.requires_cuda
def test_needs_cuda():
    import torch

    assert torch.cuda.is_available()
"""

_INNER_INI = """
[pytest]
addopts = -p no:cacheprovider --strict-markers
markers =
    requires_cuda: needs a CUDA GPU
    requires_gpus(n): needs at least n CUDA GPUs
    multirank: starts several gloo ranks
"""


def test_conftest_restores_env_fails_leaked_process_groups_and_skips_gpu_tests(
    tmp_path: Path,
) -> None:
    for name in ("conftest.py", "dist_harness.py"):
        shutil.copy(TESTS_DIR / name, tmp_path / name)
    (tmp_path / "pytest.ini").write_text(_INNER_INI)
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(_INNER_TESTS))

    proc = run_python(["-m", "pytest", "-q", "--junitxml=report.xml"], cwd=tmp_path, timeout=120)

    outcomes: dict[str, list[str]] = {}
    for case in ET.parse(tmp_path / "report.xml").iter("testcase"):
        outcomes.setdefault(case.attrib["name"], []).extend(
            f"{c.tag}: {c.attrib.get('message', '')}" for c in case
        )
    report = proc.stdout + proc.stderr
    assert outcomes["test_leaks_env"] == [], report
    assert outcomes["test_env_restored"] == [], report
    assert outcomes["test_group_was_destroyed"] == [], report
    [leak] = outcomes["test_leaks_process_group"]
    assert leak.startswith("error:") and "left a torch.distributed process group" in leak
    [skip] = outcomes["test_needs_many_gpus"]
    assert skip.startswith("skipped: needs 1024 CUDA GPU(s), found "), report
    assert outcomes["test_needs_cuda"] in ([], ["skipped: needs 1 CUDA GPU(s), found 0"])


def test_files_with_slow_tests_are_collected_first(request: pytest.FixtureRequest) -> None:
    """make test's xdist workers take whole files in collection order: long ones start early."""
    items = request.session.items
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    kinds = [path in slow for path in dict.fromkeys(item.path for item in items)]
    assert kinds == sorted(kinds, reverse=True), "a file without slow tests comes before one with"
