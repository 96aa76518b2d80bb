"""Tests for gpu_training.launcher: torchrun command lines, validation, and the launch env."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dist_harness import REPO_ROOT, TESTS_DIR, find_free_port, run_python
from gpu_training import launcher
from gpu_training.launcher import (
    launch_env,
    make_rdzv_id,
    multi_node_argv,
    multi_node_commands,
    parse_endpoint,
    single_node_argv,
    single_node_command,
    supervise,
)

_ID_RE = re.compile(r"--rdzv_id=(\S+)")


# --- single node ------------------------------------------------------------------------------


def test_single_node_command_matches_the_guide_exactly() -> None:
    cmd = single_node_command("examples/train_ddp.py", 4, ["--epochs", "3"])
    assert cmd == "torchrun --standalone --nproc_per_node=4 examples/train_ddp.py --epochs 3"


def test_single_node_without_args() -> None:
    assert single_node_command("t.py", 1) == "torchrun --standalone --nproc_per_node=1 t.py"


@pytest.mark.parametrize(
    "args",
    [
        ["--name", "my run"],
        ["--msg", 'it\'s "quoted"'],
        ["--glob", "*.pt", "--var", "$HOME", "--semi", "a;rm -rf /"],
        ["--empty", ""],
        ["--newline", "a\nb"],
    ],
)
def test_args_are_shell_quoted_and_round_trip(args: list[str]) -> None:
    cmd = single_node_command("dir with space/train.py", 2, args)
    assert shlex.split(cmd) == [
        "torchrun",
        "--standalone",
        "--nproc_per_node=2",
        "dir with space/train.py",
        *args,
    ]
    multi = multi_node_commands("train.py", 2, 2, "h:1", args, rdzv_id="j")
    assert all(shlex.split(line)[-len(args) :] == args for line in multi)


def test_arg_with_space_gets_quotes() -> None:
    assert single_node_command("t.py", 1, ["a b"]).endswith("t.py 'a b'")


def test_single_node_argv_is_the_unquoted_list() -> None:
    argv = single_node_argv("train.py", 2, ["--name", "my run"])
    assert argv == [
        "torchrun",
        "--standalone",
        "--nproc_per_node=2",
        "train.py",
        "--name",
        "my run",
    ]
    custom = single_node_argv("t.py", 1, program=(sys.executable, "-m", "torch.distributed.run"))
    assert custom[:3] == [sys.executable, "-m", "torch.distributed.run"]


def test_single_node_max_restarts_only_when_asked() -> None:
    assert "max_restarts" not in single_node_command("t.py", 2)
    assert "--max_restarts=0" in single_node_argv("t.py", 2, max_restarts=0)
    argv = single_node_argv("t.py", 2, ["--x"], max_restarts=3)
    assert argv.index("--max_restarts=3") < argv.index("t.py")  # a torchrun flag, not a script arg


# --- multi node -------------------------------------------------------------------------------


def test_multi_node_lines_share_one_generated_rdzv_id() -> None:
    cmds = multi_node_commands(
        "examples/train_ddp.py", nnodes=3, nproc_per_node=8, rdzv_endpoint="head-node:29500"
    )
    assert len(cmds) == 3
    ids = {_ID_RE.search(cmd).group(1) for cmd in cmds}  # type: ignore[union-attr]
    assert len(ids) == 1
    assert re.fullmatch(r"gt-[0-9a-f]{8}", ids.pop())
    for cmd in cmds:
        argv = shlex.split(cmd)
        assert argv[0] == "torchrun"
        assert "--nnodes=3" in argv and "--nproc_per_node=8" in argv
        assert "--rdzv_backend=c10d" in argv
        assert "--rdzv_endpoint=head-node:29500" in argv
        assert not any("node_rank" in a for a in argv)  # c10d ignores it
        assert not any("max_restarts" in a for a in argv)
        assert "--standalone" not in argv
        assert argv[-1] == "examples/train_ddp.py"


def test_multi_node_jobs_get_different_ids_unless_given() -> None:
    first = multi_node_commands("t.py", 2, 1, "h:29500")[0]
    second = multi_node_commands("t.py", 2, 1, "h:29500")[0]
    assert _ID_RE.search(first).group(1) != _ID_RE.search(second).group(1)  # type: ignore[union-attr]
    given = multi_node_commands("t.py", 2, 1, "h:29500", rdzv_id="job1")
    assert all("--rdzv_id=job1" in cmd for cmd in given)
    assert make_rdzv_id() != make_rdzv_id()


def test_multi_node_max_restarts_only_when_asked() -> None:
    assert "--max_restarts=3" in multi_node_commands("t.py", 2, 8, "h:1", max_restarts=3)[1]
    assert "--max_restarts=0" in multi_node_commands("t.py", 2, 8, "h:1", max_restarts=0)[0]


def test_multi_node_argv_and_ipv6_endpoint() -> None:
    argv = multi_node_argv("t.py", 2, 4, "[::1]:29500", ["--x", "1"], rdzv_id="j")
    assert argv == [
        "torchrun",
        "--nnodes=2",
        "--nproc_per_node=4",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=[::1]:29500",
        "--rdzv_id=j",
        "t.py",
        "--x",
        "1",
    ]


def test_guide_snippet_runs() -> None:
    # Verbatim from the guide (seeds/000, "Launching with torchrun").
    snippet = textwrap.dedent(
        """
        from gpu_training.launcher import single_node_command, multi_node_commands

        # Single node, 4 GPUs:
        print(single_node_command("examples/train_ddp.py", 4, ["--epochs", "3"]))
        # -> torchrun --standalone --nproc_per_node=4 examples/train_ddp.py --epochs 3

        # Two nodes, 8 GPUs each (run the matching line on each node):
        for cmd in multi_node_commands("examples/train_ddp.py", nnodes=2,
                                       nproc_per_node=8, rdzv_endpoint="head-node:29500"):
            print(cmd)
        """
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "<guide>", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0] == "torchrun --standalone --nproc_per_node=4 examples/train_ddp.py --epochs 3"
    assert len(lines) == 3 and lines[1] == lines[2]
    assert lines[1].startswith(
        "torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d "
        "--rdzv_endpoint=head-node:29500 --rdzv_id=gt-"
    )
    assert lines[1].endswith(" examples/train_ddp.py")


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: single_node_command("t.py", 0), "nproc"),
        (lambda: single_node_command("t.py", -2), "nproc"),
        (lambda: single_node_command("t.py", 2.0), "nproc"),
        (lambda: single_node_command("t.py", True), "nproc"),
        (lambda: single_node_command("t.py", "4"), "nproc"),
        (lambda: single_node_command("", 1), "script"),
        (lambda: single_node_command("   ", 1), "script"),
        (lambda: single_node_command(None, 1), "script"),
        (lambda: single_node_command("t.py", 1, "--epochs 3"), "args"),
        (lambda: single_node_command("t.py", 1, ["--epochs", 3]), "args"),
        (lambda: single_node_command("t.py", 1, max_restarts=-1), "max_restarts"),
        (lambda: multi_node_commands("t.py", 0, 8, "h:1"), "nnodes"),
        (lambda: multi_node_commands("t.py", 2, 0, "h:1"), "nproc_per_node"),
        (lambda: multi_node_commands("t.py", 2, 8, "head-node"), "rdzv_endpoint"),
        (lambda: multi_node_commands("t.py", 2, 8, "head-node:"), "rdzv_endpoint"),
        (lambda: multi_node_commands("t.py", 2, 8, ":29500"), "rdzv_endpoint"),
        (lambda: multi_node_commands("t.py", 2, 8, "h:0"), "rdzv_endpoint"),
        (lambda: multi_node_commands("t.py", 2, 8, "h:65536"), "rdzv_endpoint"),
        (lambda: multi_node_commands("t.py", 2, 8, "h:port"), "rdzv_endpoint"),
        (lambda: multi_node_commands("t.py", 2, 8, "h o:1"), "rdzv_endpoint"),
        (lambda: multi_node_commands("t.py", 2, 8, "::1:29500"), "rdzv_endpoint"),
        (lambda: multi_node_commands("t.py", 2, 8, "h:1", max_restarts=-1), "max_restarts"),
        (lambda: multi_node_commands("t.py", 2, 8, "h:1", max_restarts=1.5), "max_restarts"),
        (lambda: multi_node_commands("t.py", 2, 8, "h:1", rdzv_id=""), "rdzv_id"),
        (lambda: multi_node_commands("t.py", 2, 8, "h:1", rdzv_id="a b"), "rdzv_id"),
        (lambda: multi_node_commands("t.py", 2, 8, "h:1", rdzv_backend="static"), "rdzv_backend"),
        (lambda: multi_node_commands("", 2, 8, "h:1"), "script"),
        (lambda: launch_env({}, nproc_per_node=0), "nproc_per_node"),
    ],
)
def test_validation_errors_name_the_argument(call: Callable[[], Any], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} "):
        call()


def test_ipv6_hint() -> None:
    with pytest.raises(ValueError, match=r"\[::1\]:29500"):
        parse_endpoint("::1:29500")


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("head-node:29500", ("head-node", 29500)),
        ("10.0.0.1:1", ("10.0.0.1", 1)),
        ("node0.cluster.local:65535", ("node0.cluster.local", 65535)),
        ("[::1]:29500", ("::1", 29500)),
        ("[fe80::1%eth0]:29400", ("fe80::1%eth0", 29400)),
    ],
)
def test_parse_endpoint_accepts(endpoint: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(endpoint) == expected


# --- environment ------------------------------------------------------------------------------


def test_launch_env_sets_restart_variable_and_keeps_user_omp() -> None:
    base = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "7"}
    env = launch_env(base, nproc_per_node=4)
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["OMP_NUM_THREADS"] == "7"
    assert env["PATH"] == "/usr/bin"
    assert base == {"PATH": "/usr/bin", "OMP_NUM_THREADS": "7"}  # not modified


def test_launch_env_shares_cpus_when_omp_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "_cpu_count", lambda: 16)
    assert launch_env({}, nproc_per_node=4)["OMP_NUM_THREADS"] == "4"
    assert launch_env({}, nproc_per_node=3)["OMP_NUM_THREADS"] == "5"
    assert launch_env({}, nproc_per_node=64)["OMP_NUM_THREADS"] == "1"
    assert launch_env({})["OMP_NUM_THREADS"] == "16"


def test_train_workers_connect_to_the_agents_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train --nproc 2`` never restarts, so its workers use the agent's store, listening
    already: rank 0 opens no store of its own on a port another process may take first
    (``EADDRINUSE``; ``launch_env(restarts=False)``)."""
    job = {
        "task": {"model": "env_task:build_model", "data": "env_task:build_data"},
        "training": {"global_batch_size": 8, "per_device_batch_size": 4, "max_steps": 1},
        "run": {"output_dir": str(tmp_path / "out"), "plot": False, "progress": False},
    }
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    scripts = os.pathsep.join(str(p) for p in (REPO_ROOT / "src", TESTS_DIR, TESTS_DIR / "scripts"))
    env = {"PYTHONPATH": scripts, "ENV_RECORD": str(tmp_path)}
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    argv = ["-m", "gpu_training", "train", str(tmp_path / "job.yaml"), "--nproc", "2"]
    proc = run_python(argv, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert records[0] == records[1], records
    assert records[0]["TORCHELASTIC_USE_AGENT_STORE"] == "True", records
    assert records[0]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] is None, records
    assert records[0]["TORCHELASTIC_MAX_RESTARTS"] == "0", records


def test_launch_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GT_LAUNCH_MARKER", "yes")
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    env = launch_env()
    assert env["GT_LAUNCH_MARKER"] == "yes"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ


def test_launcher_does_not_import_torch() -> None:
    code = "import sys, gpu_training.launcher; assert 'torch' not in sys.modules, 'torch imported'"
    proc = run_python(["-c", code], timeout=60)
    assert proc.returncode == 0, proc.stderr


# --- against the real torchrun ------------------------------------------------------------------


def test_torchrun_parses_the_generated_flags() -> None:
    run = pytest.importorskip("torch.distributed.run")
    argv = multi_node_argv(
        "train.py", 2, 8, "head-node:29500", ["--lr", "0.1"], rdzv_id="job1", max_restarts=3
    )
    parsed = run.parse_args(argv[1:])
    assert (parsed.nnodes, parsed.nproc_per_node) == ("2", "8")
    assert (parsed.rdzv_backend, parsed.rdzv_endpoint, parsed.rdzv_id) == (
        "c10d",
        "head-node:29500",
        "job1",
    )
    assert parsed.max_restarts == 3
    assert (parsed.training_script, parsed.training_script_args) == ("train.py", ["--lr", "0.1"])
    single = run.parse_args(single_node_argv("t.py", 4, ["--epochs", "3"])[1:])
    assert single.standalone and single.nproc_per_node == "4"
    assert single.training_script_args == ["--epochs", "3"]


_ECHO_WORKER = """\
import json, os, sys
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS"]
out = os.path.join(sys.argv[1], "rank%s.json" % os.environ["RANK"])
with open(out, "w") as f:
    json.dump({**{k: os.environ.get(k) for k in keys}, "argv": sys.argv[2:]}, f)
"""


@pytest.mark.timeout(180)
def test_two_torchrun_agents_rendezvous_without_node_rank(tmp_path: Path) -> None:
    """Two agents on this machine, started from the generated lines, form one 2-rank job."""
    pytest.importorskip("torch")
    script = tmp_path / "echo_worker.py"
    script.write_text(_ECHO_WORKER)
    endpoint = f"127.0.0.1:{find_free_port()}"
    job_id = make_rdzv_id()
    argv = multi_node_argv(
        str(script),
        nnodes=2,
        nproc_per_node=1,
        rdzv_endpoint=endpoint,
        args=[str(tmp_path), "--name", "my run"],
        rdzv_id=job_id,
        program=(sys.executable, "-m", "torch.distributed.run"),
    )
    env = launch_env({**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"})
    agents = [
        subprocess.Popen(
            argv,
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # one killpg ends an agent and its workers
        )
        for _ in range(2)
    ]
    try:
        outputs = [agent.communicate(timeout=120)[0] for agent in agents]
    finally:
        for agent in agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
    assert [a.returncode for a in agents] == [0, 0], "\n---\n".join(outputs)
    import json

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert {r["GROUP_RANK"] for r in ranks} == {"0", "1"}  # c10d assigned the node ranks
    assert all(r["WORLD_SIZE"] == "2" and r["LOCAL_RANK"] == "0" for r in ranks)
    assert [r["TORCHELASTIC_RUN_ID"] for r in ranks] == [job_id, job_id]
    assert all(r["argv"] == ["--name", "my run"] for r in ranks)
    assert all(r["OMP_NUM_THREADS"] == "1" for r in ranks)


# --- run_torchrun: torchrun's ending --------------------------------------------------------


def test_this_interpreters_torchrun_runs_quietly_and_logs_in_a_directory_of_ours(
    tmp_path: Path,
) -> None:
    module = [sys.executable, "-m", "torch.distributed.run", "--standalone", "t.py"]
    assert supervise._quiet(module) == [*launcher.QUIET_TORCHRUN, "--standalone", "t.py"]
    assert supervise._quiet(["torchrun", "t.py"]) == ["torchrun", "t.py"]  # a user's choice
    env: dict[str, str] = {}
    made = supervise.own_log_dir(["torchrun", "t.py"], env)
    assert made is not None and env["PET_LOG_DIR"] == made and os.path.isdir(made)
    os.rmdir(made)
    assert supervise.own_log_dir(["torchrun", "--log-dir=/x", "t.py"], {}) is None
    assert supervise.own_log_dir(["torchrun", "--log_dir", "/x", "t.py"], {}) is None
    assert supervise.own_log_dir(["torchrun", "t.py"], {"PET_LOG_DIR": "/x"}) is None


_WORKER_EXITS = """
import os, sys
sys.exit(int(sys.argv[1]) if os.environ["RANK"] == sys.argv[2] or sys.argv[2] == "all" else 0)
"""
_SUPERVISED = """
import sys
from gpu_training.launcher import launch_argv, launch_env, run_torchrun
argv = launch_argv(sys.argv[1], 2, sys.argv[2:], program=(sys.executable, "-m", "torch.distributed.run"))
sys.exit(run_torchrun(argv, launch_env(nproc_per_node=2)))
"""
_HERE = """
import sys
from gpu_training.launcher import launch_argv, launch_env
from gpu_training.launcher.torchrun import run_here
sys.exit(run_here(launch_argv(sys.argv[1], 2, sys.argv[2:], program=()), launch_env(nproc_per_node=2)))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("code", "who", "expected"), [(143, "all", 143), (3, "1", 1), (0, "all", 0)]
)
@pytest.mark.parametrize("agent", ["child", "here"])
def test_run_torchrun_ends_with_one_code_and_torchruns_report_last(
    tmp_path: Path, agent: str, code: int, who: str, expected: int
) -> None:
    """Every worker stopped on request (143): 143, no report; a worker failed: the report.

    ``child``: :func:`run_torchrun` (``launch``); ``here``: torchrun's agent in the calling
    process (``train --nproc``, :func:`~gpu_training.launcher.torchrun.run_here`).
    """
    pytest.importorskip("torch")
    script = tmp_path / "worker.py"
    script.write_text(_WORKER_EXITS)
    (tmp_path / "tmp").mkdir()
    env = {"TMPDIR": str(tmp_path / "tmp")}
    runner = _SUPERVISED if agent == "child" else _HERE
    proc = run_python(["-c", runner, str(script), str(code), who], timeout=90, env=env)
    err = proc.stderr
    assert proc.returncode == expected, err[-3000:]
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    if expected == 1:
        tail = err.rstrip().splitlines()
        assert tail[-1].startswith("====") and "Root Cause" in err and "exitcode  : 3" in err
    else:
        assert "FAILED" not in err, err[-3000:]
    assert list((tmp_path / "tmp").iterdir()) == []  # no torchelastic_*, our log dir removed


_AGENT = """
import os, subprocess, sys, time
from gpu_training.launcher.supervise import Janitor
janitor = Janitor(sys.argv[1], shutdown_timeout=float(sys.argv[2]))
worker = subprocess.Popen([sys.executable, "-c", sys.argv[3]], start_new_session=True)
time.sleep(2.0)  # the janitor looks every 0.2 s (after its own start, slow on a loaded VM)
print(janitor.pid, worker.pid, flush=True)
if sys.argv[4] == "close":
    janitor.close()
    worker.kill()
    print("closed", flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


@pytest.mark.serial
@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker", ["stops", "ignores-sigterm"])
def test_janitor_stops_the_workers_of_a_killed_agent_and_removes_its_log_dir(
    tmp_path: Path, worker: str
) -> None:
    """The agent SIGKILLed: its worker (own session) gets SIGTERM, SIGKILL after the timeout."""
    log_dir = tmp_path / "torchrun-logs"
    (log_dir / "attempt_0").mkdir(parents=True)
    code = "import time; time.sleep(60)"
    if worker == "ignores-sigterm":
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    cmd = [sys.executable, "-c", _AGENT, str(log_dir), "3", code, "kill"]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=_src_env())
    assert agent.stdout is not None
    janitor, pid = (int(x) for x in agent.stdout.readline().split())
    agent.kill()
    agent.wait()
    killed = time.monotonic()
    while (_alive(pid) or _alive(janitor)) and time.monotonic() - killed < 20:
        time.sleep(0.05)
    took = time.monotonic() - killed
    assert not _alive(pid) and not _alive(janitor), f"still there after {took:.1f} s"
    # SIGTERM at once; a worker that ignores it is SIGKILLed after the 3 s given
    assert took < 2.0 if worker == "stops" else 3.0 <= took < 10.0, took
    assert not log_dir.exists()


def test_janitor_closed_on_a_normal_end_stops_nothing(tmp_path: Path) -> None:
    log_dir = tmp_path / "torchrun-logs"
    log_dir.mkdir()
    cmd = [sys.executable, "-c", _AGENT, str(log_dir), "1", "import time; time.sleep(60)", "close"]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=_src_env())
    assert agent.stdout is not None
    try:
        janitor, _ = (int(x) for x in agent.stdout.readline().split())
        assert agent.stdout.readline().strip() == "closed"
        assert not _alive(janitor)  # close() waited for it
        assert log_dir.is_dir()  # removing it is the agent's own job on a normal end
    finally:
        agent.kill()
        agent.wait()


def _src_env() -> dict[str, str]:
    paths = [str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def test_a_second_signal_during_torchruns_stop_logging_prints_no_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """srun signals torchrun twice: the second ``SignalException`` is raised inside the agent's
    ``emit`` of "Received 15 death signal". Without the guard, :mod:`logging` reports it as a
    "--- Logging error ---" traceback in the middle of a clean stop (the control below)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from gpu_training.launcher import torchrun

    class Interrupted(io.StringIO):
        def write(self, text: str) -> int:
            raise SignalException("Process 1 got signal: 15", signal.SIGTERM)

    logger = logging.getLogger("test.second_signal")
    logger.propagate = False
    handler = logging.StreamHandler(Interrupted())
    logger.addHandler(handler)
    try:
        logger.warning("Received %s death signal, shutting down workers", signal.SIGTERM)
        assert "--- Logging error ---" in capsys.readouterr().err  # the control
        with torchrun._quiet_logging_errors():
            logger.warning("Received %s death signal, shutting down workers", signal.SIGTERM)
        assert capsys.readouterr().err == ""
        assert logging.raiseExceptions  # restored
    finally:
        logger.removeHandler(handler)
