"""SLURM: the text of the sbatch script ``gpu-training launch --slurm`` writes, its bad input,
and ``DistributedContext.from_env()`` reading the srun-per-GPU variables when torchrun's are
absent. The script runs on a real SLURM in tests/test_slurm_cluster.py."""

from __future__ import annotations

import doctest
import logging
import math
import os
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpu_training.launcher.slurm as slurm_module
from dist_harness import REPO_ROOT, find_free_port
from gpu_training.cli import main
from gpu_training.ddp import DistributedContext
from gpu_training.launcher import SIGNALS_TO_HANDLE
from gpu_training.launcher.slurm import sbatch_script, time_limit_seconds

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bash scripts")


def _directives(text: str) -> list[str]:
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith("#SBATCH")]


def _srun_line(text: str) -> list[str]:
    """The words of the script's ``srun ... &`` command (continuation lines joined)."""
    joined = text.replace("\\\n", " ")
    line = next(line for line in joined.splitlines() if line.startswith("srun "))
    return shlex.split(line.removesuffix("&"))


def test_script_is_valid_bash_with_the_directives() -> None:
    text = sbatch_script("train.py", nodes=4, gpus_per_node=8, time="1-00:00:00", partition="gpu")
    proc = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    for expected in [
        "--nodes=4",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--time=1-00:00:00",
        "--partition=gpu",
        "--signal=B:USR1@90",
        "--requeue",
    ]:
        assert expected in _directives(text)


def test_one_torchrun_agent_per_node_by_this_interpreter() -> None:
    text = sbatch_script("train.py", ["--epochs", "3", "a b"], nodes=2, gpus_per_node=4,
                         max_restarts=2)  # fmt: skip
    words = _srun_line(text)
    assert words[:4] == ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert words[4:] == [
        sys.executable,  # an absolute path: the job does not need torchrun on PATH
        "-m",
        "gpu_training.launcher.torchrun",  # torchrun with a quiet end, 143 after a stop
        "--nnodes=2",
        "--nproc_per_node=4",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT",
        "--rdzv_id=$RDZV_ID",
        "--max_restarts=2",
        f"--signals-to-handle={SIGNALS_TO_HANDLE}",
        "train.py",
        "--epochs",
        "3",
        "a b",
    ]
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text.splitlines()
    other = sbatch_script("train.py", nodes=1, gpus_per_node=1, python="/opt/py 3/bin/python")
    assert _srun_line(other)[4] == "/opt/py 3/bin/python"
    with pytest.raises(ValueError, match="python must be an absolute path"):
        sbatch_script("train.py", nodes=1, gpus_per_node=1, python="python3")


@pytest.mark.parametrize(
    ("request_", "lines"),
    [("gpus-per-node", ["--gpus-per-node=4"]), ("gres", ["--gres=gpu:4"]), ("none", [])],
)
def test_the_gpu_request_is_the_one_chosen(request_: str, lines: list[str]) -> None:
    text = sbatch_script("train.py", nodes=2, gpus_per_node=4, gpu_request=request_)
    assert [d for d in _directives(text) if "gpu" in d] == lines
    assert "--nproc_per_node=4" in _srun_line(text)  # the processes per node stay


@pytest.mark.parametrize(
    ("limit", "seconds"),
    [
        ("30", 1800),
        ("1:30", 90),
        ("2:00:00", 7200),
        ("1-2", 93600),
        ("1-0:30", 88200),
        ("1-00:00:05", 86405),
        ("UNLIMITED", math.inf),
        ("0", math.inf),  # sbatch: zero is no limit
    ],
)
def test_time_limit_seconds(limit: str, seconds: float) -> None:
    assert time_limit_seconds(limit) == seconds


def test_a_time_limit_within_the_warning_is_refused() -> None:
    for limit in ("1", "1:30", "0:00:59"):
        with pytest.raises(ValueError, match=r"^time must be longer than the 90 s warning"):
            sbatch_script("train.py", nodes=1, gpus_per_node=1, time=limit)
    assert "--time=1:31" in _directives(
        sbatch_script("train.py", nodes=1, gpus_per_node=1, time="1:31")
    )


def test_cli_prints_the_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    args = ["launch", "--slurm", "--nodes", "2", "--gpus-per-node", "4", "--time", "2:00:00"]
    assert main([*args, "--gpu-request", "gres", "train.py", "--epochs", "3"]) == 0
    expected = sbatch_script(
        "train.py", ["--epochs", "3"], nodes=2, gpus_per_node=4, time="2:00:00", gpu_request="gres"
    )
    assert capsys.readouterr().out == expected
    # a job file: every rank runs `python -m gpu_training train CONFIG ARGS`
    config = REPO_ROOT / "configs" / "ddp_config.yaml"
    assert main(["launch", "--slurm", "--nodes", "2", "--gpus-per-node", "4", str(config)]) == 0
    text = capsys.readouterr().out
    joined = " ".join(text.replace("\\\n", " ").split())
    assert f"--module gpu_training train {shlex.quote(str(config))}" in joined
    assert "--job-name=ddp_config" in text and "--gpus-per-node=4" in _directives(text)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--time", "two hours"], "--time must be a SLURM time limit"),
        (["--time", "1:30"], "--time must be longer than the 90 s warning"),
        (["--partition", "a b"], "--partition must be a name"),
        (["--gpu-request", "all"], "--gpu-request: invalid choice: 'all'"),
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
    assert len(lines) == 1 and lines[0].startswith("gpu-training: error: launch"), lines
    assert fragment in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


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
