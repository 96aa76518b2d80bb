"""Per-rank step telemetry and ``gpu-training watch`` (issue 32, items 1 and 2).

2 gloo ranks train a small character model with a planted delay on rank 1 — in its data
loading or in its forward pass (tests/slow_rank_task.py, passed by import string as a
user's task) — under DDP and under FSDP2; ``watch --once --json`` must name rank 1 and the
right cause from the first 5 steps. Without a delay it must name no one (the negative
control), and telemetry must not change the math (identical losses on and off).
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_training.cli import main
from gpu_training.telemetry import StepRecord, read_rank_logs, straggler
from train_jobs import train

STEPS = 5
DELAY_MS = 150.0


def _job(out: Path, strategy: str, where: str | None, **run: Any) -> dict[str, Any]:
    options = {"slow_rank": 1, "where": where or "data", "delay_ms": DELAY_MS if where else 0.0}
    return {
        "task": "slow_rank_task:make_task",
        "task_options": options,
        "training": {
            "global_batch_size": 4,
            "per_device_batch_size": 2,
            "learning_rate": 3e-3,
            "max_steps": STEPS,
            "precision": "fp32",
            "seed": 5,
        },
        "strategy": {"name": strategy},
        "checkpoint": {"every": 100},
        "run": {
            "output_dir": str(out),
            "log_every": 1,
            "eval_every": 100,
            "eval_batches": 1,
            "plot": False,
            "tensorboard": False,
            "progress": False,
            **run,
        },
    }


def _train(tmp: Path, name: str, strategy: str, where: str | None, **run: Any) -> Path:
    out = tmp / name
    job_file = tmp / f"{name}.yaml"
    job_file.write_text(yaml.safe_dump(_job(out, strategy, where, **run)))
    train(job_file, 2, timeout=240)
    return out


def _watch(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["watch", *argv])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.multirank
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("where, cause", [("data", "data loading"), ("compute", "compute")])
def test_watch_names_the_slow_rank_and_its_cause(
    tmp_path: Path, strategy: str, where: str, cause: str
) -> None:
    out = _train(tmp_path, f"{strategy}-{where}", strategy, where)
    code, stdout, stderr = _watch(str(out), "--once", "--json", "--steps", str(STEPS))
    assert code == 0, stderr
    view = json.loads(stdout)
    assert view["straggler"]["rank"] == 1, view["verdict"]
    assert view["straggler"]["cause"] == cause, view["verdict"]
    assert view["verdict"].startswith("rank 1 arrives ") and view["verdict"].endswith(cause)
    # The lag is the planted delay, give or take the noise of two processes on two cores.
    assert 0.6 * DELAY_MS < view["straggler"]["lag_ms"] < 1.6 * DELAY_MS, view
    rows = {row["rank"]: row for row in view["rows"]}
    assert set(rows) == {0, 1} and rows[0]["step"] == rows[1]["step"] == STEPS
    assert rows[0]["lag_ms"] == 0.0
    # Both ranks take as long per step (the collective makes the fast one wait) ...
    assert abs(rows[0]["step_ms"] - rows[1]["step_ms"]) < 0.3 * DELAY_MS, rows
    # ... and the fast one waits in a collective for the slow one.
    assert rows[0]["comm_ms"] > rows[1]["comm_ms"] + 0.5 * DELAY_MS, rows
    if where == "data":
        assert rows[1]["data_ms"] > rows[0]["data_ms"] + 0.6 * DELAY_MS, rows
    else:
        assert rows[1]["compute_ms"] > rows[0]["compute_ms"] + 0.6 * DELAY_MS, rows
    assert view["loss"] is not None and view["total_steps"] == STEPS
    assert view["checkpoint"] is not None and view["checkpoint"].endswith(f"step-{STEPS:08d}")
    # The table names the same verdict.
    code, table, _ = _watch(str(out), "--once", "--steps", str(STEPS))
    assert code == 0 and view["verdict"] in " ".join(table.split())


@pytest.mark.multirank
def test_no_delay_names_no_rank_and_telemetry_leaves_the_math_alone(tmp_path: Path) -> None:
    on = _train(tmp_path, "on", "ddp", None)
    off = _train(tmp_path, "off", "ddp", None, telemetry=False)
    view = json.loads(_watch(str(on), "--once", "--json")[1])
    # Two ranks on two shared cores: the scheduler alone can make one a few ms late, which
    # the verdict may name; it never comes near the planted delay of the tests above.
    assert max(view["straggler"]["lags_ms"].values()) < DELAY_MS / 3, view["verdict"]
    logs = read_rank_logs(on)
    assert sorted(logs) == [0, 1]
    for log in logs.values():
        assert [r.step for r in log.steps] == list(range(1, STEPS + 1))
        assert log.start["world_size"] == 2 and log.start["total_steps"] == STEPS
        assert all(r.arrival_ms is not None and r.memory_kind == "rss" for r in log.steps)
    assert not (off / "telemetry").exists()

    def losses(run: Path) -> list[float]:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines if '"train"' in line]

    assert losses(on) == losses(off)  # the DDP hook is the default all-reduce, timed
    code, _, stderr = _watch(str(off), "--once")
    assert code == 2 and stderr.count("\n") == 1 and "no telemetry" in stderr


def test_the_verdict_reads_arrival_not_step_time() -> None:
    def rank(data: float, arrival: float, comm: float) -> list[StepRecord]:
        return [
            StepRecord(step=s, step_ms=160.0, data_ms=data, arrival_ms=arrival, comm_ms=comm)
            for s in range(1, 6)
        ]

    late_data = straggler({0: rank(0.5, 2.0, 150.0), 1: rank(150.5, 152.0, 1.0)})
    assert (late_data.rank, late_data.cause) == (1, "data loading")
    assert late_data.message == "rank 1 arrives 150 ms late: its data loading"
    late_compute = straggler({0: rank(0.5, 152.0, 1.0), 1: rank(0.5, 2.0, 150.0)})
    assert (late_compute.rank, late_compute.cause) == (0, "compute")
    even = straggler({0: rank(0.5, 2.0, 1.0), 1: rank(0.5, 3.0, 1.0)})
    assert even.rank is None and even.message.startswith("no straggler")
    # The newest steps every rank recorded: rank 1 late at steps 6-10 only.
    early = rank(0.5, 2.0, 1.0)
    later = [StepRecord(step=s, step_ms=160.0, arrival_ms=80.0) for s in range(6, 11)]
    both = [StepRecord(step=s, step_ms=160.0, arrival_ms=2.0) for s in range(1, 11)]
    assert straggler({0: both, 1: early + later}).rank == 1
    assert straggler({0: both}).rank is None  # one rank: nothing to compare


def test_a_torn_line_and_a_resumed_step_are_read_sensibly(tmp_path: Path) -> None:
    folder = tmp_path / "telemetry"
    folder.mkdir()
    first = StepRecord(step=1, step_ms=10.0, time=1.0).to_json()
    again = StepRecord(step=1, step_ms=12.0, time=2.0).to_json()
    lines = [json.dumps({"kind": "start", "world_size": 1}), json.dumps(first), json.dumps(again)]
    (folder / "rank0.jsonl").write_text("\n".join(lines) + '\n{"kind": "st')
    (log,) = read_rank_logs(tmp_path).values()
    assert [r.step_ms for r in log.steps] == [12.0] and log.start["world_size"] == 1


def test_the_view_prices_the_run_and_shows_a_recorded_stall(tmp_path: Path) -> None:
    from gpu_training.commands._watch_view import build_view
    from gpu_training.hardware import GPU_TYPES
    from gpu_training.stall_report import StallReport
    from gpu_training.telemetry import RankTelemetry

    now = time.time()
    start = {"world_size": 2, "total_steps": 110, "device_name": "NVIDIA H100 80GB HBM3"}
    (tmp_path / "telemetry").mkdir()
    for rank in (0, 1):
        head = {"kind": "start", "rank": rank, **start, "started": now - 3600}  # an hour ago
        (tmp_path / "telemetry" / f"rank{rank}.jsonl").write_text(json.dumps(head) + "\n")
        late = rank == 1
        lines = [
            StepRecord(
                step=s,
                step_ms=200.0,
                data_ms=0.5,
                compute_ms=60.0 if late else 10.0,
                arrival_ms=60.0 if late else 10.0,
                time=now,
            ).to_json()
            for s in range(1, 11)
        ]
        with open(tmp_path / "telemetry" / f"rank{rank}.jsonl", "a") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
    tel = RankTelemetry(tmp_path / "other", rank=1)
    report = StallReport(rank=1, stalled_for=5.0, last_step=10, culprits=[1], message="stuck")
    tel.stalled(report)
    tel.close()
    stall_line = (tmp_path / "other" / "telemetry" / "rank1.jsonl").read_text().splitlines()[-1]
    with open(tmp_path / "telemetry" / "rank1.jsonl", "a") as f:
        f.write(stall_line + "\n")
    view = build_view(tmp_path, now=now)
    price = GPU_TYPES["h100"].price_per_gpu_hour
    assert price is not None and view.price_per_gpu_hour == price
    assert view.cost_so_far == pytest.approx(2 * price)  # 2 GPUs for an hour
    assert view.eta_s == pytest.approx(100 * 0.2)  # 100 steps left at 200 ms
    assert view.verdict == "rank 1 arrives 50 ms late: its compute"
    assert view.stall == "stuck"
    assert view.checkpoint is None


def test_a_run_refused_before_its_first_step_leaves_no_file(tmp_path: Path) -> None:
    """Bad input found on the ranks (a resume refused) writes nothing: the file is opened at
    the first record, with its start record first."""
    from gpu_training.telemetry import RankTelemetry

    RankTelemetry(tmp_path, rank=0, start={"world_size": 1}).close()
    assert not (tmp_path / "telemetry").exists()
    tel = RankTelemetry(tmp_path, rank=0, start={"world_size": 1})
    tel.note("stall", message="stuck")
    tel.close()
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "telemetry" / "rank0.jsonl").open()]
    assert kinds == ["start", "stall"]


def test_a_killed_rank_leaves_every_flushed_window(tmp_path: Path) -> None:
    from dist_harness import run_python

    script = f"""
import os
from gpu_training.telemetry import RankTelemetry
tel = RankTelemetry({str(tmp_path)!r}, rank=3, start={{"world_size": 4}})
for step, _ in enumerate(tel.batches(range(10))):
    tel.compute_started()
    tel.optimizer_started()
    tel.step_done(step + 1)
    if step + 1 == 5:
        tel.flush()  # a log step: steps 1-4 are closed and written
    if step + 1 == 8:
        os._exit(9)  # killed: no close, no flush
"""
    proc = run_python(["-c", script], timeout=60)
    assert proc.returncode == 9, proc.stderr
    (log,) = read_rank_logs(tmp_path).values()
    assert log.rank == 3 and log.start["world_size"] == 4
    assert [r.step for r in log.steps] == [1, 2, 3, 4]


def test_a_ddp_rank_keeps_one_hook_and_arrives_after_its_last_gradient(
    free_port: int, tmp_path: Path
) -> None:
    """Under DDP the first backward learns which gradient comes last; one hook stays on it.

    A hook on every parameter for good would cost a Python call per parameter per step; the
    arrival is when backward produced the last gradient of the step's last micro-batch.
    """
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from gpu_training.telemetry import RankTelemetry

    store = dist.TCPStore("127.0.0.1", free_port, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
        tel = RankTelemetry(tmp_path, rank=0, start={"world_size": 1})
        assert tel.attach(model) == "ddp_last_gradient"
        first = model.module[0].weight  # the first layer's gradient comes last in backward

        def hooks(param: torch.Tensor) -> int:
            return len(getattr(param, "_post_accumulate_grad_hooks", None) or {})

        assert [hooks(p) for p in model.parameters()] == [1, 1, 1, 1]
        for step, _ in enumerate(tel.batches(range(3))):
            tel.compute_started()
            for micro in range(2):  # two micro-batches: the first without the all-reduce
                context = model.no_sync() if micro == 0 else contextlib.nullcontext()
                with context:
                    model(torch.randn(3, 4)).sum().backward()
                if micro == 0:
                    time.sleep(0.05)  # compute between the micro-batches
            tel.optimizer_started()
            tel.step_done(step + 1)
            if step == 0:  # settled: only the last gradient's parameter keeps a hook
                assert [hooks(p) for p in model.parameters()] == [1, 0, 0, 0]
                assert hooks(first) == 1
        tel.close()
    finally:
        del model
        dist.destroy_process_group()
    steps = read_rank_logs(tmp_path)[0].steps
    assert [r.step for r in steps] == [1, 2, 3]
    for record in steps:
        # the arrival is the last micro-batch's, after the 50 ms between them; had it been
        # taken at the first micro-batch, those 50 ms would count as time in the collective.
        # The bounds leave a loaded CI machine room (a one-rank all-reduce took 7 ms there)
        assert record.arrival_ms is not None and record.arrival_ms >= 50.0, record
        assert record.comm_ms < 40.0 and record.compute_ms >= 50.0, record
