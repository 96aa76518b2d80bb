"""Elastic recovery and two-node rendezvous under ``gpu-training launch``, N trials each.

**Elastic** (``--trials``, default 20): ``gpu-training launch --nproc 2 --max-restarts 1``
runs ``tests/scripts/elastic_train.py`` (``train_one_epoch`` + ``CheckpointManager``, a
checkpoint every 4 optimizer steps); once it reports a random step, rank 1 is SIGKILLed at a
random moment of the next epoch. A trial succeeds when torchrun restarts the group, the job
resumes from its newest checkpoint and finishes with exit code 0 and final weights that are
bit-for-bit those of an uninterrupted run (CRC32 of every tensor, both ranks), and it was
training again within 30 s of the kill. Timings: kill -> new workers started, -> checkpoint
loaded (``resumed at step S``), -> first step done after the resume ("recovered").

**No restarts** (``--fail-trials``, default 5): the same kill under ``--max-restarts 0`` must
end the job with a non-zero exit code within 10 s, torchrun's report naming rank 1 as the
root cause.

**Two nodes** (``--two-node-trials``, default 10): two ``gpu-training launch --nnodes 2
--nproc 1 --rdzv-endpoint 127.0.0.1:PORT`` agents (no ``--rdzv-id``: they derive the same
one) train the built-in char-LM task (``configs/ddp_config.yaml`` made tiny with ``--set``)
for 24 steps; a trial succeeds when both agents exit 0 and the final checkpoint's weights
equal those of the same job run on one node with ``--nproc 2``.

Usage::

    python benchmarks/elastic_recovery.py [--trials 20] [--fail-trials 5]
        [--two-node-trials 10] [--seed 0] [--json PATH]

Every process runs with ``OMP_NUM_THREADS=1`` and gloo on 127.0.0.1 (``GLOO_SOCKET_IFNAME=lo``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "elastic_train.py"
CONFIG = ROOT / "configs" / "ddp_config.yaml"
EPOCHS = 20  # 2 optimizer steps each: 40 steps, a checkpoint every 4
RECOVERY_LIMIT_S = 30.0
FAIL_LIMIT_S = 10.0
TINY_JOB = [
    "task_options.n_layer=2",
    "task_options.n_embd=32",
    "task_options.n_head=2",
    "task_options.block_size=32",
    "training.max_steps=24",
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


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo")
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class Job:
    """``gpu-training launch ...`` in its own session; stdout lines timestamped by a thread."""

    def __init__(self, launch_args: list[str], log: Path, cwd: Path = ROOT) -> None:
        cmd = [sys.executable, "-m", "gpu_training", "launch", *launch_args]
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self.start = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self._queue: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self.workers: dict[tuple[int, int], int] = {}  # (rank, attempt) -> pid
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put((time.monotonic(), line.rstrip("\n")))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float) -> tuple[float, re.Match[str]] | None:
        """The first new line matching ``pattern`` (and when it came), or None."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if item is None:
                self._queue.put(None)  # keep the end-of-output mark for later calls
                return None
            self.lines.append(item)
            stamp, line = item
            if found := re.match(r"rank (\d+) pid (\d+) attempt (\d+)", line):
                self.workers[(int(found[1]), int(found[3]))] = int(found[2])
            if found := re.fullmatch(pattern, line):
                return stamp, found

    def finish(self, timeout: float) -> int | None:
        """Exit code, reading the remaining output; None if still running after ``timeout``."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        while self.wait_for(r"(?!x)x", timeout=2.0) is not None:  # drain what is left
            pass
        return code

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def close(self) -> None:
        pids = [self.proc.pid, *self.workers.values()]
        for pid in pids:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def _final_crcs(job: Job) -> dict[int, str]:
    found = (
        re.fullmatch(r"rank (\d+) done step \d+ weights ([0-9a-f]{8})", x) for _, x in job.lines
    )
    return {int(m[1]): m[2] for m in found if m}


def reference_crc(work: Path) -> str:
    job = Job(
        ["--nproc", "2", str(SCRIPT), str(work / "ref"), "--epochs", str(EPOCHS)], work / "ref.log"
    )
    try:
        code = job.finish(timeout=180)
    finally:
        job.close()
    crcs = _final_crcs(job)
    if code != 0 or sorted(crcs) != [0, 1] or len(set(crcs.values())) != 1:
        raise SystemExit(f"reference run failed (exit {code}):\n{job.output()[-3000:]}")
    return crcs[0]


def elastic_trial(work: Path, rng: random.Random, reference: str) -> dict[str, Any]:
    """One kill of rank 1 under --max-restarts 1; see the module docstring."""
    after_step = 2 * rng.randint(2, EPOCHS - 3)
    args = ["--nproc", "2", "--max-restarts", "1", str(SCRIPT), str(work / "ck")]
    job = Job([*args, "--epochs", str(EPOCHS)], work / "job.log")
    result: dict[str, Any] = {"kill_after_step": after_step, "ok": False}
    try:
        if job.wait_for(rf"step {after_step}", timeout=120) is None:
            result["error"] = f"never reached step {after_step}"
            return result
        time.sleep(rng.uniform(0.0, 0.1))  # a random point of the next epoch
        os.kill(job.workers[(1, 0)], signal.SIGKILL)
        killed = time.monotonic()
        restarted = job.wait_for(r"rank \d+ pid \d+ attempt 1", timeout=60)
        resumed = job.wait_for(r"resumed at step (\d+)", timeout=60)
        stepped = job.wait_for(r"step \d+", timeout=60)
        code = job.finish(timeout=120)
    finally:
        job.close()
    crcs = _final_crcs(job)
    result.update(
        exit_code=code,
        restart_s=None if restarted is None else restarted[0] - killed,
        resume_s=None if resumed is None else resumed[0] - killed,
        recovered_s=None if stepped is None else stepped[0] - killed,
        resumed_at_step=None if resumed is None else int(resumed[1][1]),
        same_weights=sorted(crcs) == [0, 1] and set(crcs.values()) == {reference},
    )
    result["ok"] = bool(
        code == 0
        and result["same_weights"]
        and result["recovered_s"] is not None
        and result["recovered_s"] <= RECOVERY_LIMIT_S
    )
    if not result["ok"]:
        result["output_tail"] = job.output()[-2000:] + "\n" + job.log.read_text()[-3000:]
    return result


def fail_trial(work: Path, rng: random.Random) -> dict[str, Any]:
    """The same kill under --max-restarts 0: a non-zero exit within 10 s, naming rank 1."""
    after_step = 2 * rng.randint(2, EPOCHS - 3)
    args = ["--nproc", "2", "--max-restarts", "0", str(SCRIPT), str(work / "ck")]
    job = Job([*args, "--epochs", str(EPOCHS)], work / "job.log")
    try:
        if job.wait_for(rf"step {after_step}", timeout=120) is None:
            return {"ok": False, "error": f"never reached step {after_step}"}
        os.kill(job.workers[(1, 0)], signal.SIGKILL)
        killed = time.monotonic()
        code = job.finish(timeout=60)
        exit_s = time.monotonic() - killed
    finally:
        job.close()
    report = job.log.read_text()
    root = report.split("Root Cause", 1)[-1]
    names_rank = bool(re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root))
    ok = code not in (None, 0) and exit_s <= FAIL_LIMIT_S and names_rank
    return {"ok": ok, "exit_code": code, "exit_s": exit_s, "names_rank_1": names_rank}


def _final_weights(out: Path) -> dict[str, Any]:
    import torch

    steps = sorted((out / "checkpoints").glob("step-*"))
    return dict(torch.load(steps[-1] / "state.pt", weights_only=True)["model_state"])


def _train_args(out: Path) -> list[str]:
    sets = [f"run.output_dir={out}", *TINY_JOB]
    return [str(CONFIG), *(x for s in sets for x in ("--set", s))]


def two_node_reference(work: Path) -> dict[str, Any]:
    job = Job(["--nproc", "2", *_train_args(work / "ref-train")], work / "ref-train.log")
    try:
        code = job.finish(timeout=300)
    finally:
        job.close()
    if code != 0:
        raise SystemExit(f"single-node reference failed (exit {code}):\n{job.log.read_text()}")
    return _final_weights(work / "ref-train")


def two_node_trial(work: Path, reference: dict[str, Any]) -> dict[str, Any]:
    endpoint = f"127.0.0.1:{_free_port()}"
    args = ["--nnodes", "2", "--nproc", "1", "--rdzv-endpoint", endpoint, *_train_args(work)]
    started = time.monotonic()
    agents = [Job(args, work / f"agent{i}.log") for i in range(2)]
    try:
        codes = [agent.finish(timeout=300) for agent in agents]
    finally:
        for agent in agents:
            agent.close()
    seconds = time.monotonic() - started
    same, diff = False, None
    if codes == [0, 0]:
        final = _final_weights(work)
        diff = max(float((final[k] - reference[k]).abs().max()) for k in reference)
        same = diff == 0.0
    result = {"ok": codes == [0, 0] and same, "exit_codes": codes, "seconds": seconds}
    result["max_abs_diff"] = diff
    if not result["ok"]:
        result["output_tail"] = "\n---\n".join(a.log.read_text()[-3000:] for a in agents)
    return result


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    return (
        f"median {statistics.median(values):.1f} s, "
        f"min {min(values):.1f} s, max {max(values):.1f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="elastic kill trials")
    parser.add_argument("--fail-trials", type=int, default=5, help="--max-restarts 0 trials")
    parser.add_argument("--two-node-trials", type=int, default=10, help="two-agent trials")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/elastic.json")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    report: dict[str, Any] = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "load_average_before": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="elastic-") as tmp:
        work = Path(tmp)
        if args.trials:
            reference = reference_crc(work)
            trials = []
            for i in range(args.trials):
                (work / f"elastic{i}").mkdir()
                trial = elastic_trial(work / f"elastic{i}", rng, reference)
                trials.append(trial)
                rec = trial.get("recovered_s")
                print(
                    f"elastic {i + 1:2d}/{args.trials}: {'ok ' if trial['ok'] else 'FAIL'} "
                    f"killed after step {trial['kill_after_step']}, resumed at step "
                    f"{trial.get('resumed_at_step')}, training again "
                    f"{'-' if rec is None else f'{rec:.1f}'} s after the kill",
                    flush=True,
                )
                if not trial["ok"]:
                    print(trial.get("output_tail", trial.get("error", "")), flush=True)
            report["elastic"] = {"reference_crc": reference, "trials": trials}
        if args.fail_trials:
            fails = []
            for i in range(args.fail_trials):
                (work / f"fail{i}").mkdir()
                fails.append(fail_trial(work / f"fail{i}", rng))
                print(f"no-restart {i + 1}/{args.fail_trials}: {fails[-1]}", flush=True)
            report["no_restart"] = fails
        if args.two_node_trials:
            (work / "two-ref").mkdir()
            reference_weights = two_node_reference(work / "two-ref")
            pairs = []
            for i in range(args.two_node_trials):
                (work / f"two{i}").mkdir()
                pairs.append(two_node_trial(work / f"two{i}", reference_weights))
                shown = {k: v for k, v in pairs[-1].items() if k != "output_tail"}
                print(f"two-node {i + 1:2d}/{args.two_node_trials}: {shown}", flush=True)
                if not pairs[-1]["ok"]:
                    print(pairs[-1]["output_tail"], flush=True)
            report["two_node"] = pairs

    report["load_average_after"] = os.getloadavg()[0]
    print("\n" + "=" * 78)
    print(report["command"])
    print(
        f"1-min load average: {report['load_average_before']:.1f} before, "
        f"{report['load_average_after']:.1f} after (2 CPUs)"
    )
    if "elastic" in report:
        trials = report["elastic"]["trials"]
        ok = sum(t["ok"] for t in trials)
        print(
            f"elastic recovery (--max-restarts 1, rank 1 SIGKILLed): {ok}/{len(trials)} recovered "
            "with the uninterrupted run's final weights"
        )
        for key, label in (
            ("restart_s", "workers restarted"),
            ("resume_s", "checkpoint loaded"),
            ("recovered_s", "training again"),
        ):
            values = [t[key] for t in trials if t.get(key) is not None]
            print(f"  kill -> {label:<18} {_summary(values)}")
    if "no_restart" in report:
        fails = report["no_restart"]
        ok = sum(f["ok"] for f in fails)
        exits = [f["exit_s"] for f in fails if "exit_s" in f]
        print(
            f"--max-restarts 0: {ok}/{len(fails)} exited non-zero within {FAIL_LIMIT_S:.0f} s "
            f"naming rank 1; kill -> exit {_summary(exits)}"
        )
    if "two_node" in report:
        pairs = report["two_node"]
        ok = sum(p["ok"] for p in pairs)
        print(
            f"two nodes on 127.0.0.1 (2 launch agents x 1 process): {ok}/{len(pairs)} finished "
            f"with the single-node run's weights; {_summary([p['seconds'] for p in pairs])}"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    failed = [
        t for key in ("no_restart", "two_node") for t in report.get(key, []) if not t["ok"]
    ] + [t for t in report.get("elastic", {}).get("trials", []) if not t["ok"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
