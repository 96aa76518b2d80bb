"""``gpu-training launch --slurm --submit`` on a real SLURM: a throwaway cluster on this host
(tests/slurm_cluster.py: munged, slurmctld, two slurmd as two nodes; CPU only).

One cluster for the module. The ``runs`` fixture submits every job at once, each driven by a
scenario in a thread (the time-limit jobs wait a minute or more for SLURM's clock; the others
run meanwhile), and the tests judge what each left: the job's state, its output, its metrics
and its last checkpoint against an uninterrupted run of the same job on this machine.

The jobs train the built-in ``charlm`` at a tiny shape. Those stopped by a signal train
``held_charlm`` (tests/scripts: charlm, whose forwards wait at step 4 while a file exists), so
that the signal lands mid-run whatever SLURM's timing: SLURM checks time limits every 30 s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dist_harness import REPO_ROOT, TESTS_DIR
from gpu_training.checkpoint import consolidate
from slurm_cluster import SlurmCluster, unavailable
from train_jobs import train

_WHY = unavailable()
if _WHY is not None:  # said once, for the module; make test installs what it needs
    pytest.skip(_WHY, allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.multirank, pytest.mark.timeout(600)]

STEPS = 24
HOLD_AFTER = 3  # held_charlm waits in step 4: the signalled runs stop there
SHAPES = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16}
DDP = {"name": "ddp"}
FSDP = {"name": "fsdp", "block_classes": ["Block"]}
_SUBMITTED = re.compile(r"Submitted batch job (\d+)")
_ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY")


def _job_file(directory: Path, strategy: dict[str, Any], *, held: bool) -> Path:
    job = {
        "task": "held_charlm:task" if held else "charlm",
        "task_options": SHAPES,
        "training": {
            "global_batch_size": 8,
            "per_device_batch_size": 4,
            "learning_rate": 3e-3,
            "warmup_steps": 2,
            "max_steps": STEPS,
            "precision": "fp32",
            "seed": 7,
        },
        "strategy": strategy,
        "checkpoint": {"every": 10, "keep_last_n": 3},
        "run": {
            "output_dir": str(directory / "out"),
            "log_every": 1,
            "eval_every": 1000,
            "progress": False,
            "plot": False,
            "tensorboard": False,
        },
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _bare_path() -> str:
    """SLURM's commands and the system's, not this interpreter's environment (no torchrun)."""
    dirs = ["/usr/local/bin", "/usr/bin", "/bin"]
    dirs += [str(Path(p).parent) for p in map(shutil.which, ("sbatch", "srun")) if p]
    here = str(Path(sys.executable).parent)
    return os.pathsep.join(d for d in dict.fromkeys(dirs) if d != here)


@dataclass
class Job:
    """One job on the cluster, from its submission to its end."""

    cluster: SlurmCluster
    directory: Path
    stop: threading.Event
    env: dict[str, str] = field(default_factory=dict)
    id: str = ""

    def command_env(self) -> dict[str, str]:
        """The environment of the commands that submit it (and so of the job): no torchrun."""
        env = {**self.cluster.env, **self.env, "PATH": _bare_path()}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), str(TESTS_DIR / "scripts")])
        return env

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``gpu-training ARGV`` by this interpreter, from the job's directory."""
        return subprocess.run(
            [sys.executable, "-m", "gpu_training", *argv],
            cwd=self.directory,
            env=self.command_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def launch(self, *flags: str, strategy: dict[str, Any], held: bool = False) -> None:
        """``gpu-training launch --slurm --submit FLAGS job.yaml``."""
        job = _job_file(self.directory, strategy, held=held)
        self._submitted(self.cli("launch", "--slurm", "--submit", *flags, str(job)))

    def sbatch(self, *argv: str) -> None:
        """``sbatch ARGV``, from the job's directory."""
        self._submitted(
            subprocess.run(
                ["sbatch", *argv],
                cwd=self.directory,
                env=self.command_env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
        )

    def _submitted(self, proc: subprocess.CompletedProcess[str]) -> None:
        match = _SUBMITTED.search(proc.stdout)
        assert proc.returncode == 0 and match, proc.stdout + proc.stderr
        self.id = match[1]

    @property
    def out(self) -> Path:
        """The job's ``run.output_dir``."""
        return self.directory / "out"

    def output(self) -> str:
        """What the job wrote to its ``%x-%j.out`` (every run of it: ``--open-mode=append``)."""
        path = self.directory / f"job-{self.id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def steps(self) -> list[int]:
        """The steps in ``metrics.jsonl``, in the order written."""
        path = self.out / "metrics.jsonl"
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r["step"] for r in lines if r.get("split") == "train"]

    def until(
        self, ready: Callable[[], bool], timeout: float, what: str, *, running: bool = True
    ) -> None:
        """Polls ``ready`` for ``timeout`` s; with ``running``, fails at once if the job ended."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.stop.is_set():
                raise RuntimeError("the module is ending")
            fields = self.cluster.job(self.id)
            if time.monotonic() > deadline or (running and fields.get("JobState") in _ENDED):
                state = {k: fields.get(k) for k in ("JobState", "Reason", "Restarts")}
                raise AssertionError(
                    f"job {self.id}: no {what} in {timeout:.0f} s: {state}\n{self.output()[-3000:]}"
                )
            time.sleep(0.2)

    def ended(self, timeout: float) -> None:
        """Waits for the job's end (a requeue is not one)."""

        def ended() -> bool:
            return self.cluster.job(self.id).get("JobState") in _ENDED

        self.until(ended, timeout, "end", running=False)

    def hold(self) -> Path:
        """The file that holds its ``held_charlm`` forwards in step ``HOLD_AFTER + 1``."""
        hold = self.directory / "hold"
        self.directory.mkdir(parents=True, exist_ok=True)
        hold.touch()
        self.env.update(HOLD_FILE=str(hold), HOLD_AFTER=str(HOLD_AFTER))
        return hold

    def signal_held(self, send: Callable[[], object], arrived: str, timeout: float) -> None:
        """Once held, ``send()`` the signal; when the output shows it ``arrived``, let go."""
        self.until(lambda: len(self.steps()) >= HOLD_AFTER, 180, "held step")
        send()
        self.until(lambda: arrived in self.output(), timeout, repr(arrived))
        (self.directory / "hold").unlink()


# --- the scenarios: each drives its job to the end ---------------------------------------------

NO_GPUS = ("--gpu-request", "none")  # a CPU-only cluster
ONE_BY_TWO = ("--nodes", "1", "--gpus-per-node", "2")
TWO_BY_ONE = ("--nodes", "2", "--gpus-per-node", "1")


def _to_the_end(job: Job, *shape: str) -> None:
    job.launch(*NO_GPUS, *shape, strategy=DDP)
    job.ended(240)


def _batch_usr1(job: Job) -> None:
    """``scancel --batch --signal=USR1``: what ``--signal=B:USR1@90`` sends."""
    job.hold()
    job.launch(*NO_GPUS, *ONE_BY_TWO, strategy=DDP, held=True)
    send = ("scancel", "--batch", "--signal=USR1", job.id)
    job.signal_held(lambda: job.cluster.client(*send), "SIGUSR1 received", 60)
    job.ended(240)


def _step_usr1(job: Job) -> None:
    """``scancel --signal=USR1`` without ``--batch``: the job steps only, not the batch shell."""
    job.hold()
    job.launch(*NO_GPUS, *ONE_BY_TWO, strategy=DDP, held=True)
    send = ("scancel", "--signal=USR1", job.id)
    # torchrun's agent logs the signal it got (10: SIGUSR1)
    job.signal_held(lambda: job.cluster.client(*send), "Received 10 death signal", 60)
    job.ended(240)


def _scancel(job: Job) -> None:
    job.hold()
    job.launch(*NO_GPUS, *ONE_BY_TWO, strategy=DDP, held=True)
    job.signal_held(lambda: job.cluster.client("scancel", job.id), "SIGTERM received", 60)
    job.ended(120)
    time.sleep(8)  # a requeued job would be back by now (cred_expire + 1 s)


def _time_limit_warning(job: Job) -> None:
    """``--time 3``: SLURM's own USR1 warning, 90 s before the limit (60-90 s after start)."""
    job.hold()
    job.launch(*NO_GPUS, *ONE_BY_TWO, "--time", "3", strategy=DDP, held=True)
    job.signal_held(lambda: None, "SIGUSR1 received", 150)
    job.ended(240)


def _time_limit_term(job: Job) -> None:
    """FSDP on 2 nodes at its time limit with no warning (``--signal=B:USR1@0``, as at a
    site that drops it): SIGTERM to every process of the job, the batch shell included."""
    job.hold()
    job_file = _job_file(job.directory, FSDP, held=True)
    printed = job.cli("launch", "--slurm", *NO_GPUS, *TWO_BY_ONE, "--time", "5", str(job_file))
    assert printed.returncode == 0, printed.stderr
    (job.directory / "job.sbatch").write_text(printed.stdout)
    # sbatch's flags win over the script's: a one-minute limit (the shortest), no warning
    job.sbatch("--time=1", "--signal=B:USR1@0", "job.sbatch")
    job.signal_held(lambda: None, "SIGTERM received", 150)
    job.ended(240)


SCENARIOS: dict[str, Callable[[Job], None]] = {
    # the time-limit jobs first: they wait longest for SLURM's clock
    "time_limit_term": _time_limit_term,
    "time_limit_warning": _time_limit_warning,
    "one_by_two": lambda job: _to_the_end(job, *ONE_BY_TWO),
    "two_by_one": lambda job: _to_the_end(job, *TWO_BY_ONE),
    "batch_usr1": _batch_usr1,
    "step_usr1": _step_usr1,
    "scancel": _scancel,
}


def _drive(scenario: Callable[[Job], None], job: Job) -> Job:
    scenario(job)
    return job


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A 2-node cluster for the module; every daemon and job process stopped after."""
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2) as running:
        yield running


@pytest.fixture(scope="module")
def runs(
    cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Job]]]:
    """Every scenario, started at once; each test waits for the ones it judges."""
    stop = threading.Event()
    root = tmp_path_factory.mktemp("jobs")
    pool = ThreadPoolExecutor(max_workers=len(SCENARIOS))
    futures = {
        name: pool.submit(_drive, scenario, Job(cluster, root / name, stop))
        for name, scenario in SCENARIOS.items()
    }
    yield futures
    stop.set()
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def references(
    runs: dict[str, Future[Job]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The same jobs, uninterrupted, on 2 ranks here (while the cluster's jobs run)."""
    root = tmp_path_factory.mktemp("references")
    out = {}
    for name, strategy in (("ddp", DDP), ("fsdp", FSDP)):
        job = _job_file(root / name, strategy, held=False)
        train(job, 2, timeout=240)
        out[name] = root / name / "out"
    return out


def _result(runs: dict[str, Future[Job]], name: str) -> Job:
    return runs[name].result(timeout=400)


def _final_state(out: Path, tmp: Path) -> dict[str, Any]:
    """The last checkpoint's model and optimizer state, whatever its format."""
    step = out / "checkpoints" / f"step-{STEPS:08d}"
    target = tmp / f"{out.parent.name}.pt"
    return dict(torch.load(consolidate(step, target, include_optimizer=True), weights_only=True))


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {set(a) ^ set(b)}"
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _assert_resumed_exactly(job: Job, reference: Path, tmp: Path) -> None:
    assert job.steps() == list(range(1, STEPS + 1)), "every step once, in order"
    ours, theirs = _final_state(job.out, tmp), _final_state(reference, tmp)
    _assert_same(ours["model_state"], theirs["model_state"], "model")
    _assert_same(ours["optimizer_state"], theirs["optimizer_state"], "optimizer")


def _stopped_quietly(output: str, stops: int) -> None:
    """A stopped run ends with the workers' line and exit code 143, no traceback."""
    assert "Traceback" not in output and "SignalException" not in output, output[-4000:]
    assert len(re.findall(r"preempted by SIG\w+: saved step \d+", output)) == stops, output
    ends = re.findall(
        r"gpu-training: (?:stopped early|job \d+ cancelled) \(exit code (\d+)\)", output
    )
    assert ends == ["143"] * stops, output[-3000:]


# --- trained to the end ------------------------------------------------------------------------


def test_one_node_two_ranks_trains_to_the_end_without_torchrun_on_path(
    runs: dict[str, Future[Job]], references: dict[str, Path], tmp_path: Path
) -> None:
    job = _result(runs, "one_by_two")
    fields = job.cluster.job(job.id)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", job.output()
    assert "ddp on 2 rank(s)" in job.output()
    script = job.cluster.client("scontrol", "write", "batch_script", job.id, "-").stdout
    assert f"{sys.executable} -m gpu_training.launcher.torchrun" in script
    _assert_resumed_exactly(job, references["ddp"], tmp_path)


def test_two_nodes_one_rank_each_trains_to_the_end(
    runs: dict[str, Future[Job]], references: dict[str, Path], tmp_path: Path
) -> None:
    job = _result(runs, "two_by_one")
    fields = job.cluster.job(job.id)
    assert fields["JobState"] == "COMPLETED" and fields["NumNodes"] == "2", job.output()
    assert "gpu-training: 2 node(s)" in job.output()
    _assert_resumed_exactly(job, references["ddp"], tmp_path)


# --- stopped by a signal -------------------------------------------------------------------


def _requeued_once(job: Job) -> None:
    fields = job.cluster.job(job.id)
    assert fields["JobState"] == "COMPLETED", job.output()[-3000:]
    assert fields["Restarts"] == "1", job.output()[-3000:]


def test_scancel_cancels_after_a_checkpoint(runs: dict[str, Future[Job]]) -> None:
    job = _result(runs, "scancel")
    fields = job.cluster.job(job.id)
    assert fields["JobState"] == "CANCELLED", job.output()[-3000:]
    assert fields["Restarts"] == "0", "cancelled, not requeued"
    assert fields["ExitCode"] == "143:0"
    step = HOLD_AFTER + 1
    assert job.steps() == list(range(1, step + 1))
    assert (job.out / "checkpoints" / f"step-{step:08d}" / "manifest.json").is_file()
    _stopped_quietly(job.output(), 1)


def test_warning_to_the_batch_shell_requeues_and_resumes_exactly(
    runs: dict[str, Future[Job]], references: dict[str, Path], tmp_path: Path
) -> None:
    job = _result(runs, "batch_usr1")
    _requeued_once(job)
    _stopped_quietly(job.output(), 1)
    _assert_resumed_exactly(job, references["ddp"], tmp_path)


def test_signal_to_the_job_steps_only_still_requeues(
    runs: dict[str, Future[Job]], references: dict[str, Path], tmp_path: Path
) -> None:
    job = _result(runs, "step_usr1")
    _requeued_once(job)
    assert "SIGUSR1 received" not in job.output()  # the batch shell never saw it
    _stopped_quietly(job.output(), 1)
    _assert_resumed_exactly(job, references["ddp"], tmp_path)


def test_short_time_limit_warns_requeues_and_resumes_exactly(
    runs: dict[str, Future[Job]], references: dict[str, Path], tmp_path: Path
) -> None:
    job = _result(runs, "time_limit_warning")
    _requeued_once(job)
    assert "SIGUSR1 received" in job.output()  # SLURM's own --signal=B:USR1@90
    _stopped_quietly(job.output(), 1)
    _assert_resumed_exactly(job, references["ddp"], tmp_path)


def test_fsdp_on_two_nodes_at_its_time_limit_requeues_and_resumes_exactly(
    runs: dict[str, Future[Job]], references: dict[str, Path], tmp_path: Path
) -> None:
    job = _result(runs, "time_limit_term")
    _requeued_once(job)
    output = job.output()
    assert "DUE TO TIME LIMIT" in output and "SIGTERM received" in output
    assert "fsdp on 2 rank(s)" in output
    _stopped_quietly(output, 1)
    _assert_resumed_exactly(job, references["fsdp"], tmp_path)


# --- refused before submission ---------------------------------------------------------------


def test_a_time_limit_within_the_warning_is_refused_before_submission(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    job = Job(cluster, tmp_path / "short", threading.Event())
    job_file = _job_file(job.directory, DDP, held=False)
    proc = job.cli(
        "launch", "--slurm", "--submit", "--gpu-request", "none", "--gpus-per-node", "2",
        "--job-name", "too-short", "--time", "1:30", str(job_file),
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == "", proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-training: error: launch: --time "), lines
    assert "90 s warning" in lines[0] and "'1:30'" in lines[0]
    names = cluster.client("squeue", "-h", "-o", "%j").stdout.split()
    assert "too-short" not in names
    assert sorted(p.name for p in job.directory.iterdir()) == ["job.yaml"]


def test_gpus_are_requested_only_when_asked(cluster: SlurmCluster, tmp_path: Path) -> None:
    """This cluster has no GPUs, like a CPU partition: a GPU request is refused by sbatch."""
    job = Job(cluster, tmp_path / "gpus", threading.Event())
    job_file = _job_file(job.directory, DDP, held=False)
    for request in ([], ["--gpu-request", "gpus-per-node"], ["--gpu-request", "gres"]):
        flags = ["--slurm", "--submit", *request, "--gpus-per-node", "2", "--job-name", "gpus"]
        proc = job.cli("launch", *flags, str(job_file))
        assert proc.returncode == 1 and "Invalid generic resource" in proc.stderr, proc
        hint = "--gpu-request none leaves the GPU request out" in proc.stderr
        assert hint == (not request), proc.stderr  # only when the request was not chosen
    assert "gpus" not in cluster.client("squeue", "-h", "-o", "%j").stdout.split()
    # --gpu-request none: the 1 x 2 and 2 x 1 jobs above ran on this cluster
