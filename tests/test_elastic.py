"""``gpu-training launch`` end to end on CPU ranks: two "nodes" on 127.0.0.1, elastic restarts
that resume exactly, a fast failure without restarts, SIGTERM leaving no process behind, and
the built-in task (the Trainer flow) recovering from a killed worker.

One trial of each case (the suite's time is shared): the N-of-N figures (20 elastic kills,
10 two-node runs) come from ``benchmarks/elastic_recovery.py``. How ``launch`` stops the
workers of a SIGKILLed torchrun is tested with a fake torchrun in tests/test_launch.py.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from dist_harness import REPO_ROOT, TESTS_DIR, find_free_port
from gpu_training.checkpoint import CheckpointManager
from gpu_training.ddp import DistributedContext
from gpu_training.preemption import EXIT_PREEMPTED

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.slow,
    pytest.mark.serial,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

SCRIPT = TESTS_DIR / "scripts" / "elastic_train.py"
EPOCHS = 12  # 2 optimizer steps each; a checkpoint every 4 steps
RECOVERY_LIMIT_S = 30.0
STOP_LIMIT_S = 10.0
_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    env = {k: v for k, v in env.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), str(TESTS_DIR)])
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo")
    return env


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name, or None when gone (or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat(int(entry))
        if fields is not None:
            parents[int(entry)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        parent_pid = todo.pop()
        kids = [child for child, parent in parents.items() if parent == parent_pid]
        found += kids
        todo += kids
    return found


def _group_alive(pgid: int) -> bool:
    """True while any non-zombie process of group ``pgid`` exists."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat(int(entry))
        if fields is not None and int(fields[2]) == pgid:
            return True
    return False


class _Launch:
    """``gpu-training launch ARGS`` in a session of its own, stdout read by a thread."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpu_training", "launch", *args],
                cwd=REPO_ROOT,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self.lines: list[str] = []
        self.workers: dict[tuple[int, int], int] = {}  # (rank, attempt) -> pid
        self.groups = {self.proc.pid}  # process groups to check and, at the end, kill
        self._queue: queue.Queue[tuple[float, str] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put((time.monotonic(), line.rstrip("\n")))
        self._queue.put(None)

    def poll(self, pattern: str, timeout: float) -> tuple[float, re.Match[str]] | None:
        """The next line matching ``pattern`` and when it came, or None after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if item is None:  # end of output: keep the mark for later calls
                self._queue.put(None)
                return None
            stamp, line = item
            self.lines.append(line)
            if found := re.fullmatch(r"rank (\d+) pid (\d+) attempt (\d+)", line):
                self.workers[(int(found[1]), int(found[3]))] = int(found[2])
                self.groups.add(int(found[2]))  # torchrun makes each worker a session leader
            if found := re.fullmatch(pattern, line):
                return stamp, found

    def wait_for(self, pattern: str, timeout: float) -> tuple[float, re.Match[str]]:
        found = self.poll(pattern, timeout)
        if found is None:
            raise AssertionError(f"no line {pattern!r} within {timeout:.0f}s\n{self.output()}")
        return found

    def finish(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout:.0f}s\n{self.output()}") from None
        while (item := self._queue.get(timeout=10)) is not None:
            self.lines.append(item[1])
        self._queue.put(None)
        return code

    def output(self) -> str:
        return "\n".join(self.lines[-40:]) + "\n--- stderr ---\n" + self.log.read_text()[-4000:]

    def close(self) -> None:
        for pgid in self.groups:
            if _group_alive(pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def _tiny(ckpt: Path, *launch_args: str) -> list[str]:
    return [*launch_args, "--nproc", "2", str(SCRIPT), str(ckpt), "--epochs", str(EPOCHS)]


def _final_crcs(lines: list[str], word: str = "done") -> dict[int, tuple[int, str]]:
    pattern = rf"rank (\d+) {word} step (\d+) weights ([0-9a-f]{{8}})"
    found = (re.fullmatch(pattern, line) for line in lines)
    return {int(m[1]): (int(m[2]), m[3]) for m in found if m}


def _checkpoint_crc(directory: Path) -> tuple[int, str]:
    ckpt = CheckpointManager(directory, ctx=DistributedContext())
    latest = ckpt.latest(verify_checksums=True)
    assert latest is not None, f"no checkpoint in {directory}"
    state = ckpt.load(latest)
    crc = 0
    for tensor in state["model"].values():
        crc = zlib.crc32(tensor.contiguous().numpy().tobytes(), crc)
    return ckpt.manifest(latest)["step"], f"{crc:08x}"


def _assert_all_gone(job: _Launch, within: float) -> None:
    deadline = time.monotonic() + within
    while any(_group_alive(g) for g in job.groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [g for g in job.groups if _group_alive(g)]
    assert not left, f"process groups {left} outlived the job\n{job.output()}"


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory: pytest.TempPathFactory) -> list[_Launch]:
    """The tiny job, uninterrupted, on two launch agents (--nnodes 2, one process each)."""
    work = tmp_path_factory.mktemp("two-node")
    endpoint = f"127.0.0.1:{find_free_port()}"
    node = ["--nnodes", "2", "--nproc", "1", "--rdzv-endpoint", endpoint]
    args = [*node, str(SCRIPT), str(work / "ck"), "--epochs", str(EPOCHS)]
    agents = [_Launch(args, work / f"agent{i}.log") for i in range(2)]
    try:
        codes = [agent.finish(timeout=90) for agent in agents]
    finally:
        for agent in agents:
            agent.close()
    assert codes == [0, 0], "\n---\n".join(a.output() for a in agents)
    return agents


@pytest.fixture(scope="module")
def uninterrupted_crc(two_node_run: list[_Launch]) -> str:
    """Final weights' CRC of the tiny 2-rank job run to the end without interruption."""
    crcs = {r: c for agent in two_node_run for r, c in _final_crcs(agent.lines).items()}
    assert crcs[0] == (2 * EPOCHS, crcs[0][1])
    return crcs[0][1]


def test_two_nodes_rendezvous_without_an_id_and_agree(two_node_run: list[_Launch]) -> None:
    """No --rdzv-id given: the agents derived the same one; each ran one rank; same weights."""
    per_agent = [_final_crcs(agent.lines) for agent in two_node_run]
    assert sorted(r for crcs in per_agent for r in crcs) == [0, 1]  # one rank on each agent
    assert len({crc for crcs in per_agent for crc in crcs.values()}) == 1
    ids = {
        found for a in two_node_run for found in re.findall(r"--rdzv_id=(\S+)", a.log.read_text())
    }
    assert len(ids) == 1


# --- the tiny train_one_epoch job ---------------------------------------------------------------


@pytest.mark.timeout(150)
def test_killed_worker_restarts_and_finishes_with_uninterrupted_weights(
    tmp_path: Path, uninterrupted_crc: str
) -> None:
    """One node, --max-restarts 1, rank 1 SIGKILLed: the final weights are those of the
    uninterrupted run (on two nodes: the same 2-rank job), bit for bit."""
    rng = random.Random(7)
    after = 2 * rng.randint(3, 6)  # at least one checkpoint (step 4) before the kill
    job = _Launch(_tiny(tmp_path / "ck", "--max-restarts", "1"), tmp_path / "err.log")
    try:
        job.wait_for(rf"step {after}", timeout=90)
        time.sleep(rng.uniform(0.0, 0.1))  # somewhere in the next epoch
        os.kill(job.workers[(1, 0)], signal.SIGKILL)
        killed = time.monotonic()
        job.wait_for(r"rank \d pid \d+ attempt 1", timeout=RECOVERY_LIMIT_S)
        _, resumed = job.wait_for(r"resumed at step (\d+)", timeout=RECOVERY_LIMIT_S)
        stepped, _ = job.wait_for(r"step \d+", timeout=RECOVERY_LIMIT_S)
        code = job.finish(timeout=90)
    finally:
        job.close()
    assert stepped - killed <= RECOVERY_LIMIT_S
    assert 4 <= int(resumed[1]) <= after + 2, job.output()  # the newest checkpoint before the kill
    assert code == 0, job.output()
    crcs = _final_crcs(job.lines)
    assert crcs == {0: (2 * EPOCHS, uninterrupted_crc), 1: (2 * EPOCHS, uninterrupted_crc)}


@pytest.mark.timeout(120)
def test_without_restarts_a_killed_worker_fails_the_job_fast_naming_it(tmp_path: Path) -> None:
    job = _Launch(_tiny(tmp_path / "ck", "--max-restarts", "0"), tmp_path / "err.log")
    try:
        job.wait_for(r"step 6", timeout=90)
        os.kill(job.workers[(1, 0)], signal.SIGKILL)
        killed = time.monotonic()
        code = job.finish(timeout=STOP_LIMIT_S + 20)
        took = time.monotonic() - killed
        _assert_all_gone(job, within=5)
    finally:
        job.close()
    assert code == 1, job.output()
    assert took <= STOP_LIMIT_S, f"exited {took:.1f}s after the kill"
    report = job.log.read_text()
    root = report.split("Root Cause", 1)[-1]
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root), report[-3000:]
    assert re.search(r"exitcode\s*:\s*-9\b", root)
    assert "gpu-training launch: the job failed (exit code 1)" in report


@pytest.mark.timeout(120)
def test_sigterm_to_launch_saves_the_step_and_leaves_no_process(tmp_path: Path) -> None:
    job = _Launch(_tiny(tmp_path / "ck"), tmp_path / "err.log")
    try:
        job.wait_for(r"step 6", timeout=90)
        assert sorted(job.workers) == [(0, 0), (1, 0)], job.output()
        os.kill(job.proc.pid, signal.SIGTERM)
        sent = time.monotonic()
        code = job.finish(timeout=STOP_LIMIT_S + 20)
        _assert_all_gone(job, within=max(0.5, STOP_LIMIT_S - (time.monotonic() - sent)))
        took = time.monotonic() - sent
    finally:
        job.close()
    assert took <= STOP_LIMIT_S, f"processes lived {took:.1f}s after the signal"
    assert code == EXIT_PREEMPTED, job.output()  # 143: stopped by SIGTERM, checkpoint written
    stops = _final_crcs(job.lines, word="stopped at")
    assert sorted(stops) == [0, 1] and stops[0] == stops[1], job.output()
    assert stops[0][0] > 6
    assert _checkpoint_crc(tmp_path / "ck") == stops[0]  # that very step, saved intact


# --- the built-in task through `gpu-training train` -----------------------------------------

_TRAIN = [
    "task_options.n_layer=2",
    "task_options.n_embd=32",
    "task_options.n_head=2",
    "task_options.block_size=32",
    "training.max_steps=40",
    "training.global_batch_size=16",
    "training.per_device_batch_size=8",
    "training.warmup_steps=2",
    "checkpoint.every=4",
    "run.log_every=2",
    "run.eval_every=1000",
    "run.eval_batches=2",
    "run.plot=false",
    "run.tensorboard=false",
]


def _rank_pids(root: int, rank: int) -> list[int]:
    """The workers below ``root`` whose environment says RANK=rank (torchrun sets it)."""
    found = []
    for pid in _descendants(root):
        with contextlib.suppress(OSError):
            if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
    return found


@pytest.mark.timeout(180)
def test_builtin_task_recovers_from_a_killed_worker(tmp_path: Path) -> None:
    """The Trainer flow (`gpu-training train` on every rank, from a job file with --set
    overrides) under --max-restarts 1: rank 1 killed, the job resumes and finishes."""
    out = tmp_path / "out"
    sets = [f"run.output_dir={out}", *_TRAIN]
    config = str(REPO_ROOT / "configs" / "ddp_config.yaml")
    args = ["--nproc", "2", "--max-restarts", "1", config, *(a for s in sets for a in ("--set", s))]
    job = _Launch(args, tmp_path / "err.log")
    try:
        job.wait_for(r"step 10/40 \|.*", timeout=120)
        (victim,) = _rank_pids(job.proc.pid, 1)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        resumed, found = job.wait_for(r"resumed from \S+ \(step (\d+)\)", RECOVERY_LIMIT_S)
        job.wait_for(r"step 40/40 \| loss.*", timeout=120)
        code = job.finish(timeout=60)
    finally:
        job.close()
    assert code == 0, job.output()
    assert resumed - killed <= RECOVERY_LIMIT_S
    assert 8 <= int(found[1]) <= 12, job.output()  # the newest checkpoint before the kill
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*"))[-1] == "step-00000040"
