"""SLURM: the sbatch script ``gpu-training launch --slurm`` writes (run against a fake
``srun``/``scontrol``/``torchrun``), and ``DistributedContext.from_env()`` reading the
srun-per-GPU variables when torchrun's are absent."""

from __future__ import annotations

import doctest
import logging
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import gpu_training.launcher.slurm as slurm_module
from dist_harness import REPO_ROOT, find_free_port
from gpu_training.cli import main
from gpu_training.ddp import DistributedContext
from gpu_training.launcher import SIGNALS_TO_HANDLE
from gpu_training.launcher.slurm import sbatch_script

pytestmark = [
    pytest.mark.serial,
    pytest.mark.skipif(sys.platform == "win32", reason="bash scripts"),
]

JOB_ID = 1234
HOSTS = ("node01", "node02")

_FAKE_SRUN = r"""#!/bin/bash
# One copy of the command per node (SLURM_NODEID set); forwards USR1/TERM like srun.
echo "$*" >> "$FAKE_LOG/srun.args"
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do
    SLURM_NODEID=$i SLURM_PROCID=$i SLURMD_NODENAME="node0$((i + 1))" "$@" &
    pids+=($!)
done
forward() { kill -s "$1" "${pids[@]}" 2>/dev/null; }
trap 'forward USR1' USR1
trap 'forward TERM' TERM
rc=0
for pid in "${pids[@]}"; do
    while :; do
        wait "$pid"; r=$?
        kill -0 "$pid" 2>/dev/null || break
    done
    if [ "$r" -ne 0 ]; then rc=$r; fi
done
exit "$rc"
"""
_FAKE_SCONTROL = r"""#!/bin/bash
case "$1" in
    show) printf 'node01\nnode02\n' ;;
    requeue) echo "requeue $2" >> "$FAKE_LOG/scontrol" ;;
    *) exit 1 ;;
esac
"""
_FAKE_TORCHRUN = r"""#!/bin/bash
out="$FAKE_LOG/torchrun.$SLURM_NODEID"
printf '%s\n' "$@" > "$out.args"
echo "OMP_NUM_THREADS=$OMP_NUM_THREADS" > "$out.env"
echo "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=$TORCH_DISABLE_SHARE_RDZV_TCP_STORE" >> "$out.env"
if [ -n "${FAKE_TRAIN_SECONDS:-}" ]; then
    trap 'echo USR1 > "$out.signal"; exit 1' USR1
    touch "$out.started"
    for ((s = 0; s < FAKE_TRAIN_SECONDS * 10; s++)); do sleep 0.1; done
fi
exit 0
"""
_FAKE_SBATCH = r"""#!/bin/bash
cat > "$FAKE_LOG/submitted.sh"
echo "Submitted batch job 4242"
"""


@pytest.fixture
def cluster(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A bin/ directory of fake SLURM tools and the environment of a 2-node batch job."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in [
        ("srun", _FAKE_SRUN),
        ("scontrol", _FAKE_SCONTROL),
        ("torchrun", _FAKE_TORCHRUN),
        ("sbatch", _FAKE_SBATCH),
    ]:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        FAKE_LOG=str(log),
        SLURM_JOB_ID=str(JOB_ID),
        SLURM_JOB_NODELIST="node[01-02]",
        SLURM_JOB_NUM_NODES="2",
        SLURM_CPUS_PER_TASK="16",
    )
    return log, env


def _script(tmp_path: Path, **kwargs: Any) -> Path:
    text = sbatch_script("train.py", ["--epochs", "3", "a b"], nodes=2, gpus_per_node=4, **kwargs)
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    return path


def test_script_is_valid_bash_with_the_directives() -> None:
    text = sbatch_script("train.py", nodes=4, gpus_per_node=8, time="1-00:00:00", partition="gpu")
    proc = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    directives = [
        line.split(None, 1)[1] for line in text.splitlines() if line.startswith("#SBATCH")
    ]
    for expected in [
        "--nodes=4",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--time=1-00:00:00",
        "--partition=gpu",
        "--signal=B:USR1@90",
        "--requeue",
    ]:
        assert expected in directives


def test_fake_cluster_runs_one_identical_torchrun_line_per_node(
    tmp_path: Path, cluster: tuple[Path, dict[str, str]]
) -> None:
    log, env = cluster
    script = _script(tmp_path, max_restarts=2)
    proc = subprocess.run(
        ["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [(log / f"torchrun.{node}.args").read_text().splitlines() for node in (0, 1)]
    assert lines[0] == lines[1]  # c10d: the same line on every node, no --node_rank
    assert lines[0] == [
        "--nnodes=2",
        "--nproc_per_node=4",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={HOSTS[0]}:{29500 + JOB_ID % 1000}",  # the first host of the job
        f"--rdzv_id=gt-slurm-{JOB_ID}-0",
        "--max_restarts=2",
        f"--signals-to-handle={SIGNALS_TO_HANDLE}",
        "train.py",
        "--epochs",
        "3",
        "a b",
    ]
    for node in (0, 1):
        env_lines = (log / f"torchrun.{node}.env").read_text().split()
        assert env_lines == ["OMP_NUM_THREADS=4", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"]
    srun_args = (log / "srun.args").read_text().split()
    assert srun_args[:3] == ["--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert not (log / "scontrol").exists(), "a finished job is not requeued"


@pytest.mark.timeout(60)
def test_time_limit_warning_reaches_the_workers_and_requeues(
    tmp_path: Path, cluster: tuple[Path, dict[str, str]]
) -> None:
    log, env = cluster
    script = _script(tmp_path, time="01:00:00")
    proc = subprocess.Popen(
        ["bash", str(script)],
        env={**env, "FAKE_TRAIN_SECONDS": "30"},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
            (log / f"torchrun.{n}.started").exists() for n in (0, 1)
        ):
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGUSR1)  # what --signal=B:USR1@90 does
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert all((log / f"torchrun.{n}.signal").read_text().strip() == "USR1" for n in (0, 1)), out
    assert (log / "scontrol").read_text().split() == ["requeue", str(JOB_ID)], out
    assert proc.returncode == 1, out  # the job's code: torchrun exits 1 when signalled
    assert "requeueing job 1234" in out


def test_cli_prints_the_script_and_submits_it(
    tmp_path: Path,
    cluster: tuple[Path, dict[str, str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log, env = cluster
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.chdir(tmp_path)
    args = ["launch", "--slurm", "--nodes", "2", "--gpus-per-node", "4", "--time", "2:00:00"]
    assert main([*args, "train.py", "--epochs", "3"]) == 0
    printed = capsys.readouterr().out
    expected = sbatch_script(
        "train.py", ["--epochs", "3"], nodes=2, gpus_per_node=4, time="2:00:00"
    )
    assert printed == expected
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("FAKE_LOG", str(log))
    assert main([*args, "--submit", "train.py", "--epochs", "3"]) == 0
    assert capsys.readouterr().out == "Submitted batch job 4242\n"
    assert (log / "submitted.sh").read_text() == expected
    # a job file: every rank runs `python -m gpu_training train CONFIG ARGS`
    config = REPO_ROOT / "configs" / "ddp_config.yaml"
    assert main(["launch", "--slurm", "--nodes", "2", "--gpus-per-node", "4", str(config)]) == 0
    text = capsys.readouterr().out
    joined = " ".join(text.replace("\\\n", " ").split())
    assert f"--module gpu_training train {shlex.quote(str(config))}" in joined
    assert "--job-name=ddp_config" in text


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--time", "two hours"], "--time must be a SLURM time limit"),
        (["--partition", "a b"], "--partition must be a name"),
        (["--submit", "--job-name", "x"], "sbatch not found on PATH"),
        (["--rdzv-endpoint", "h:1"], "sets the rendezvous itself"),
    ],
)
def test_cli_bad_slurm_input(
    argv: list[str],
    fragment: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no sbatch here
    code = main(["launch", "--slurm", "--nodes", "2", "--gpus-per-node", "4", *argv, "train.py"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-training: error: launch: "), lines
    assert fragment in lines[0]


def test_module_doctests() -> None:
    assert doctest.testmod(slurm_module).failed == 0


# --- DistributedContext.from_env(): srun one task per GPU ---------------------------------------


def _srun_env(rank: int, **extra: str) -> dict[str, str]:
    env = {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % 4), "SLURM_NTASKS": "8"}
    return {**env, "SLURM_NTASKS_PER_NODE": "4", **extra}


def test_from_env_reads_srun_variables_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gpu_training.ddp"):
        ctx = DistributedContext.from_env(_srun_env(6, MASTER_ADDR="n1", MASTER_PORT="1"))
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (6, 2, 8, 4)
    assert "from SLURM srun variables" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gpu_training.ddp"):
        DistributedContext.from_env(_srun_env(0))
    assert "MASTER_ADDR/MASTER_PORT are not set" in caplog.text  # init would fail: say why


def test_torchrun_variables_win_over_srun() -> None:
    # torchrun started under srun (our sbatch script): SLURM_PROCID is the node, not the rank
    env = {**_srun_env(1), "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}
    env["LOCAL_WORLD_SIZE"] = "4"
    ctx = DistributedContext.from_env(env)
    assert (ctx.rank, ctx.local_rank, ctx.world_size) == (5, 1, 8)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (0, 0, 1, 1)),
        # the batch script itself: SLURM_NTASKS describes the job, this is one process
        ({**_srun_env(0), "ENVIRONMENT": "BATCH"}, (0, 0, 1, 1)),
        # ... but srun's tasks inside it have the step variables
        ({**_srun_env(3), "ENVIRONMENT": "BATCH", "SLURM_STEP_NUM_TASKS": "8"}, (3, 3, 8, 4)),
        # no SLURM_NTASKS_PER_NODE: this node's entry of the tasks-per-node layout
        (
            {
                "SLURM_PROCID": "4",
                "SLURM_LOCALID": "0",
                "SLURM_NTASKS": "5",
                "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
                "SLURM_NODEID": "2",
            },
            (4, 0, 5, 1),
        ),
    ],
)
def test_from_env_srun_detection(env: dict[str, str], expected: tuple[int, ...]) -> None:
    ctx = DistributedContext.from_env(env)
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == expected


def test_from_env_inconsistent_srun_variables_name_slurm() -> None:
    with pytest.raises(ValueError, match="SLURM environment"):
        DistributedContext.from_env(_srun_env(9))  # rank 9 of 8
    with pytest.raises(ValueError, match="SLURM_NTASKS must be an integer"):
        DistributedContext.from_env({**_srun_env(0), "SLURM_NTASKS": "eight"})


_SRUN_TASK = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from gpu_training.ddp import cleanup_distributed, init_distributed
    ctx = init_distributed()
    total = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(total)
    print(f"rank {ctx.rank}/{ctx.world_size} local {ctx.local_rank} sum {total.item():g}",
          flush=True)
    cleanup_distributed()
    """
)


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_srun_style_tasks_form_a_process_group_without_torchrun() -> None:
    """Two processes started the way `srun --ntasks-per-node=2 python train.py` would."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        base.pop(key, None)
    base.update(PYTHONPATH=str(REPO_ROOT / "src"), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(find_free_port()))
    base.update(SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SRUN_TASK],
            env={**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]
    try:
        outs = [proc.communicate(timeout=90)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for rank, out in enumerate(outs):
        assert f"rank {rank}/2 local {rank} sum 3" in out, out
