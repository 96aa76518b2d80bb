"""``gpu-training launch`` without training: flags, printed commands, bad input, and the
supervision of torchrun (signals forwarded, no orphans, the job's exit code) with a fake
torchrun. The real torchrun runs are in tests/test_elastic.py."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dist_harness import REPO_ROOT, run_python
from gpu_training.cli import main
from gpu_training.launcher import (
    FORWARDED_SIGNALS,
    SIGNALS_TO_HANDLE,
    launch_argv,
    shared_rdzv_id,
)
from gpu_training.launcher.supervise import _job_exit_code

pytestmark = pytest.mark.serial  # limits in seconds: make test runs these alone

SCRIPT = REPO_ROOT / "tests" / "scripts" / "elastic_train.py"
CONFIG = REPO_ROOT / "configs" / "ddp_config.yaml"


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-training: error: launch: "), err
    return lines[0]


# --- launch_argv and the rendezvous id -----------------------------------------------------


def test_single_node_argv_is_standalone_with_signals_and_restarts() -> None:
    argv = launch_argv("train.py", 4, ["--lr", "0.1"], max_restarts=2)
    assert argv == [
        "torchrun",
        "--standalone",
        "--nproc_per_node=4",
        "--max_restarts=2",
        f"--signals-to-handle={SIGNALS_TO_HANDLE}",
        "train.py",
        "--lr",
        "0.1",
    ]
    assert "SIGUSR1" in SIGNALS_TO_HANDLE.split(",")  # SLURM's warning must not kill torchrun
    assert set(SIGNALS_TO_HANDLE.split(",")) == {s.name for s in FORWARDED_SIGNALS}


def test_multi_node_argv_uses_c10d_a_shared_id_and_no_node_rank() -> None:
    argv = launch_argv("train.py", 8, nnodes=2, rdzv_endpoint="node0:29500", module=False)
    assert argv[:4] == ["torchrun", "--nnodes=2", "--nproc_per_node=8", "--rdzv_backend=c10d"]
    assert "--rdzv_endpoint=node0:29500" in argv and "--standalone" not in argv
    assert not any("node_rank" in a for a in argv)  # c10d ignores it (docs/multi-node.md)
    ids = [a for a in argv if a.startswith("--rdzv_id=")]
    assert ids == [f"--rdzv_id={shared_rdzv_id('node0:29500', 2, 8, 'train.py')}"]
    module = launch_argv("gpu_training", 2, ["train", "c.yaml"], module=True)
    assert module[-4:] == ["--module", "gpu_training", "train", "c.yaml"]


def test_shared_rdzv_id_is_the_same_on_every_node_and_per_job() -> None:
    parts = ("head:29500", 2, 8, "train.py", ["--lr", "1"])
    assert shared_rdzv_id(*parts, env={}) == shared_rdzv_id(*parts, env={})
    assert shared_rdzv_id(*parts, env={}) != shared_rdzv_id("head:29500", 2, 8, "train.py", env={})
    slurm = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2"}
    assert shared_rdzv_id(*parts, env=slurm) == "gt-slurm-77-2"  # a requeue gets a new one


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"nnodes": 2}, "rdzv_endpoint"),
        ({"rdzv_id": "x"}, "rdzv_id needs"),
        ({"nnodes": 0}, "nnodes"),
        ({"nnodes": 2, "rdzv_endpoint": "node0"}, "rdzv_endpoint must be 'host:port'"),
    ],
)
def test_launch_argv_rejects_bad_combinations(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        launch_argv("t.py", 2, **kwargs)  # type: ignore[arg-type]


def test_exit_code_is_the_jobs() -> None:
    assert _job_exit_code(0, []) == 0
    assert _job_exit_code(1, []) == 1  # a worker failed
    assert _job_exit_code(1, [signal.SIGTERM]) == 143  # torchrun says 1 when signalled
    assert _job_exit_code(0, [signal.SIGTERM]) == 0  # finished anyway
    assert _job_exit_code(-signal.SIGKILL, []) == 137  # torchrun itself was killed


# --- the command: --print and bad input ------------------------------------------------------


def test_print_single_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["launch", "--print", "--nproc", "2", "--max-restarts", "1", str(SCRIPT), "a b"]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    command = shlex.split(lines[-1])
    assert command == [
        "torchrun",
        "--standalone",
        "--nproc_per_node=2",
        "--max_restarts=1",
        f"--signals-to-handle={SIGNALS_TO_HANDLE}",
        str(SCRIPT),
        "a b",
    ]
    exports = dict(line.removeprefix("export ").split("=", 1) for line in lines[:-1])
    if "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ:
        assert exports["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert set(exports) <= {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "OMP_NUM_THREADS"}


def test_print_without_restarts_leaves_the_workers_on_the_agents_store(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    for restarts in ([], ["--max-restarts", "0"]):
        assert main(["launch", "--print", "--nproc", "2", *restarts, str(SCRIPT)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert not any("TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in line for line in lines), lines


def test_print_multi_node_same_line_and_id_on_every_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["launch", "--print", "--nnodes", "2", "--nproc", "4", "--rdzv-endpoint", "n0:29500"]
    assert main([*args, str(SCRIPT)]) == 0
    first = capsys.readouterr().out.splitlines()
    assert main([*args, str(SCRIPT)]) == 0  # what the second node computes
    assert capsys.readouterr().out.splitlines() == first
    assert first[-2] == "# on each of the 2 nodes (the same line everywhere):"
    command = shlex.split(first[-1])
    assert "--rdzv_backend=c10d" in command and "--rdzv_endpoint=n0:29500" in command
    assert main([*args, "--rdzv-id", "job-7", str(SCRIPT)]) == 0
    assert "--rdzv_id=job-7" in capsys.readouterr().out


def test_print_config_runs_the_train_command_on_every_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["launch", "--print", "--nproc", "2", str(CONFIG), "--set", "training.max_steps=50"]
    assert main(argv) == 0
    command = shlex.split(capsys.readouterr().out.splitlines()[-1])
    tail = ["--module", "gpu_training", "train", str(CONFIG), "--set", "training.max_steps=50"]
    assert command[-len(tail) :] == tail


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--nproc", "0", "{script}"], "--nproc/--gpus-per-node: expected an integer >= 1, got 0"),
        (["--nproc", "2", "--nnodes", "2", "--rdzv-endpoint", "node0", "{script}"], "host:port"),
        (["--nproc", "2", "--nnodes", "2", "--rdzv-endpoint", "node0:", "{script}"], "host:port"),
        (["--nproc", "2", "{missing}"], "script '{missing}' does not exist"),
        (["--nproc", "2", "--nnodes", "2", "{script}"], "--nnodes > 1 needs --rdzv-endpoint"),
        (["--nproc", "2", "--rdzv-id", "x", "{script}"], "--rdzv-id needs --rdzv-endpoint"),
        (["--nproc", "2", "--submit", "{script}"], "--submit needs --slurm"),
        (["--nproc", "2", "--image", "i", "{script}"], "--image needs --k8s"),
        (["--slurm", "--k8s", "--nproc", "2", "{script}"], "exclusive"),
        (["--slurm", "{script}"], "--slurm needs --gpus-per-node"),
        (["--nproc", "2", "{tmp}"], "is not a file"),
        (["--nproc", "2", "{config}", "--nproc", "2"], "not in ARGS"),
        (["--nproc", "2", "{config}", "--set", "training.lerning_rate=1"], "learning_rate"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_starts_nothing(
    argv: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")  # evidence of a start
    names = {"script": str(script), "missing": str(tmp_path / "nope.py"), "tmp": str(tmp_path)}
    names["config"] = str(CONFIG)
    code = main(["launch", *(a.format(**names) for a in argv)])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == ""
    line = " ".join(captured.err.split())
    assert fragment.format(**names) in line, line
    if "learning_rate" not in fragment:  # a config error is ConfigError's own line
        _one_error_line(captured.err)
    time.sleep(0.2)
    assert not marker.exists(), "a process was started"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"], "something was written"


def test_launch_help_is_fast_and_torch_free() -> None:
    code = "import sys; from gpu_training.cli import build_parser; build_parser(); "
    code += "assert 'torch' not in sys.modules, 'torch imported'"
    proc = run_python(["-c", code], timeout=60)
    assert proc.returncode == 0, proc.stderr


# --- supervision, with a fake torchrun ---------------------------------------------------------

# Like torchrun: starts a "worker" in a session of its own, forwards SIGTERM to it, exits 1.
_FAKE_TORCHRUN = """
import os, signal, subprocess, sys, time
work = sys.argv[1]
worker = subprocess.Popen([sys.executable, os.path.join(work, "worker.py"), work],
                          start_new_session=True)
signalled = []
def forward(signum, frame):
    signalled.append(signum)
    worker.send_signal(signum)
signal.signal(signal.SIGTERM, forward)
open(os.path.join(work, "torchrun.pid"), "w").write(str(os.getpid()))
code = worker.wait()
sys.exit(1 if signalled else code)
"""
# Like a worker with a PreemptionHandler: on SIGTERM it records it ("saves") and exits 143.
_FAKE_WORKER = """
import os, signal, sys, time
work = sys.argv[1]
def stop(signum, frame):
    open(os.path.join(work, "worker.stopped"), "w").write(str(signum))
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(work, "worker.pid"), "w").write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""
_SUPERVISOR = """
import sys
from gpu_training.launcher import run_torchrun
sys.exit(run_torchrun([sys.executable, sys.argv[1] + "/torchrun.py", sys.argv[1]],
                      shutdown_timeout=5))
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_file(path: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), f"{path.name} never appeared"
    return path.read_text()


@pytest.fixture
def fake_job(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    (tmp_path / "torchrun.py").write_text(textwrap.dedent(_FAKE_TORCHRUN))
    (tmp_path / "worker.py").write_text(textwrap.dedent(_FAKE_WORKER))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SUPERVISOR, str(tmp_path)], env=env, start_new_session=True
    )
    yield proc
    for name in ("worker.pid", "torchrun.pid"):
        if (tmp_path / name).exists() and _alive(pid := int((tmp_path / name).read_text())):
            os.killpg(pid, signal.SIGKILL)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, uses prctl")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["sigterm-supervisor", "sigkill-torchrun", "sigkill-supervisor"])
def test_signals_reach_the_worker_and_nothing_outlives_the_job(
    case: str, fake_job: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    worker = int(_wait_file(tmp_path / "worker.pid"))
    torchrun = int(_wait_file(tmp_path / "torchrun.pid"))
    time.sleep(1.2)  # the supervisor notes torchrun's descendants every 0.5 s
    victim = {"sigterm-supervisor": fake_job.pid, "sigkill-torchrun": torchrun}
    victim["sigkill-supervisor"] = fake_job.pid
    sig = signal.SIGTERM if case == "sigterm-supervisor" else signal.SIGKILL
    os.kill(victim[case], sig)
    code = fake_job.wait(timeout=20)
    # the worker got SIGTERM: forwarded (1st), from the supervisor's clean-up (2nd), or from
    # torchrun, told by the kernel that its parent died (3rd)
    assert _wait_file(tmp_path / "worker.stopped", timeout=20) == str(int(signal.SIGTERM))
    deadline = time.monotonic() + 10
    while (_alive(worker) or _alive(torchrun)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker) and not _alive(torchrun)
    expected = {"sigterm-supervisor": 143, "sigkill-torchrun": 137, "sigkill-supervisor": -9}
    assert code == expected[case]
