"""What per-rank step telemetry (``run.telemetry``) costs: the Trainer with it on and off.

Two workloads, both through ``Trainer(job, task=...).fit()`` with the same job except
``run.telemetry``, interleaved in one process (on, off, off, on, ...):

- ``demo``: the model and global batch of ``configs/ddp_config.yaml`` (``make demo``: the
  char transformer 4 x 128, block 64, global batch 32), DDP on 2 ranks (``none`` on 1);
- ``mlp``: a tiny MLP (global batch 32) whose step takes about a millisecond, where a fixed
  per-step cost shows.

A step is timed like ``bench_trainer.py`` does (its ``StepClock``: the loss function records
wall and CPU time at each call, warm-up steps excluded, log steps included). The goals:
telemetry costs at most 1% of the demo's step and 2% of a 1 ms step. Wall-clock ratios on a
shared machine move by more than that between repetitions; the CPU ratios and the cost of
the marks alone (``marks``: the loader wrapper, the compute, collective and optimizer marks
and the record of one step, timed in a loop of 20 000 steps without a model) are the
figures that hold still.

Usage::

    python benchmarks/bench_telemetry.py [--reps 7] [--quick] [--models demo mlp]
                                         [--ranks 1 2] [--json PATH]

The script starts itself once per world size under ``torch.distributed.run`` (gloo,
``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trainer import StepClock, mlp_task

from gpu_training.ddp import cleanup_distributed, init_distributed
from gpu_training.job import JobConfig
from gpu_training.tasks import Task, resolve_task
from gpu_training.telemetry import RankTelemetry
from gpu_training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
WORLD_SIZES = (1, 2)
MODELS = ("demo", "mlp")
SIDES = ("on", "off")
RUN_SIDES = ("on", "off", "off_again")
"""The Trainer runs: ``off_again`` is telemetry off once more, an A/A control whose ratio to
``off`` is the measurement's own noise floor."""
GOALS = {"demo": 0.01, "mlp": 0.02}
"""Most extra time per step telemetry may cost, as a share of the step."""
DEMO_OPTIONS = {"block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128}  # ddp_config.yaml


@dataclasses.dataclass(frozen=True)
class Plan:
    steps: int
    warmup: int
    global_batch: int
    log_every: int


PLANS = {
    "demo": Plan(steps=30, warmup=5, global_batch=32, log_every=10),
    "mlp": Plan(steps=400, warmup=50, global_batch=32, log_every=10),
}
QUICK_PLANS = {
    "demo": Plan(steps=6, warmup=2, global_batch=32, log_every=3),
    "mlp": Plan(steps=40, warmup=10, global_batch=32, log_every=10),
}


def job_for(model: str, plan: Plan, world: int, out_dir: str, telemetry: bool) -> JobConfig:
    return JobConfig.from_dict(
        {
            "task": "charlm",  # replaced by the Task given to the Trainer
            "task_options": DEMO_OPTIONS if model == "demo" else {},
            "training": {
                "global_batch_size": plan.global_batch,
                "per_device_batch_size": plan.global_batch // world,
                "max_steps": plan.steps,
                "learning_rate": 1e-3,
                "warmup_steps": 2,
                "precision": "fp32",
                "max_grad_norm": 1.0,
                "seed": 0,
            },
            "strategy": {"name": "ddp" if world > 1 else "none"},
            "checkpoint": {"every": plan.steps + 1, "resume": False, "keep_last_n": 1},
            "run": {
                "output_dir": out_dir,
                "log_every": plan.log_every,
                "eval_every": plan.steps + 1,
                "eval_batches": 1,
                "progress": False,
                "plot": False,
                "tensorboard": False,
                "telemetry": telemetry,
            },
        }
    )


def run_once(task: Task, model: str, plan: Plan, world: int, side: str) -> tuple[float, float]:
    """``(wall, cpu)`` seconds per step of one Trainer run with telemetry ``side``."""
    clock = StepClock(task.loss_fn)
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as out_dir:
        job = job_for(model, plan, world, out_dir, telemetry=side == "on")
        Trainer(job, task=dataclasses.replace(task, loss_fn=clock), quiet=True).fit()
        if side == "on":  # the records exist: telemetry ran
            assert (Path(out_dir) / "telemetry").is_dir()
    return clock.timing(plan.steps, plan.warmup)


def marks_cost_us(steps: int = 20_000, log_every: int = 10) -> float:
    """Microseconds per step of the marks and the record alone (no model, no loader work)."""
    items = list(range(steps))
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as out_dir:
        tel = RankTelemetry(out_dir, rank=0, start={})
        started = time.perf_counter()
        for i, _ in enumerate(tel.batches(items)):
            tel.compute_started()
            span = tel.collective_started(gradient=True)  # one bucket of a DDP step
            tel.collective_done(span)
            tel.optimizer_started()
            tel.step_done(i + 1)
            if (i + 1) % log_every == 0:
                tel.flush()
        tel.close()
        with_marks = time.perf_counter() - started
    started = time.perf_counter()
    for _ in iter(items):
        pass
    bare = time.perf_counter() - started
    return (with_marks - bare) / steps * 1e6


def ddp_hook_cost(ctx: Any, blocks: int, steps: int) -> dict[str, list[float]]:
    """Per-step wall and CPU seconds of a bare DDP MLP step, with and without the hook.

    Two DDP copies of the MLP, one with :meth:`RankTelemetry.attach`'s hook (settled after a
    first backward, as a run's first step settles it), stepped (forward, backward) in
    alternating blocks of ``steps``: what the hook costs, without the Trainer around it.
    """
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    models = {
        side: DistributedDataParallel(
            nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        )
        for side in SIDES
    }
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as out_dir:
        tel = RankTelemetry(out_dir, rank=ctx.rank)
        tel.attach(models["on"])
        inputs, targets = torch.randn(16, 32), torch.randint(0, 10, (16,))
        torch.nn.functional.cross_entropy(models["on"](inputs), targets).backward()
        tel.step_done(0)  # the first backward learned which gradient comes last
        out: dict[str, list[float]] = {f"{side}_{k}": [] for side in SIDES for k in ("wall", "cpu")}
        for block in range(blocks + 1):
            for side in SIDES if block % 2 == 0 else SIDES[::-1]:
                dist.barrier()
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(steps):
                    torch.nn.functional.cross_entropy(models[side](inputs), targets).backward()
                    models[side].zero_grad(set_to_none=True)
                if block:  # the first block warms up
                    out[f"{side}_wall"].append((time.perf_counter() - wall) / steps)
                    out[f"{side}_cpu"].append((time.process_time() - cpu) / steps)
    del models  # DDP's reducers before the group goes (docs/design.md, "Traps")
    return out


def worker(reps: int, quick: bool, out: Path, models: tuple[str, ...] = MODELS) -> None:
    """One rank: every (model, side) ``reps`` times, interleaved; rank 0 writes ``out``."""
    ctx = init_distributed()
    plans = QUICK_PLANS if quick else PLANS
    tasks = {
        "demo": resolve_task("charlm", DEMO_OPTIONS),
        "mlp": mlp_task(plans["mlp"].global_batch * (plans["mlp"].steps + 1)),
    }
    wall: dict[str, dict[str, list[float]]] = {m: {s: [] for s in RUN_SIDES} for m in models}
    cpu: dict[str, dict[str, list[float]]] = {m: {s: [] for s in RUN_SIDES} for m in models}
    marks = [marks_cost_us(2_000 if quick else 20_000) for _ in range(3)]
    hook: dict[str, list[float]] = {}
    try:
        if ctx.is_distributed:
            hook = ddp_hook_cost(ctx, blocks=2 if quick else 8, steps=50 if quick else 500)
        for rep in range(reps):
            for model in models:
                order = RUN_SIDES if rep % 2 == 0 else RUN_SIDES[::-1]
                for side in order:
                    gc.collect()
                    if ctx.is_distributed:
                        dist.barrier()  # every rank starts the run together
                    on = "on" if side == "on" else "off"
                    w, c = run_once(tasks[model], model, plans[model], ctx.world_size, on)
                    wall[model][side].append(w)
                    cpu[model][side].append(c)
        if ctx.is_main_process:
            payload = {
                "world_size": ctx.world_size,
                "plans": {m: dataclasses.asdict(p) for m, p in plans.items()},
                "wall_s": wall,
                "cpu_s": cpu,
                "marks_us": marks,
                "ddp_hook_s": hook,
            }
            out.write_text(json.dumps(payload))  # before cleanup: gloo may abort at exit
    finally:
        cleanup_distributed()


def launch(
    world: int, reps: int, quick: bool, timeout: float, models: tuple[str, ...] = MODELS
) -> dict[str, Any]:
    """Runs the worker on ``world`` ranks under torchrun; returns rank 0's results."""
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={world}", str(Path(__file__).resolve()),
            "--worker", "--reps", str(reps), "--out", str(out), "--models", *models,
        ] + (["--quick"] if quick else [])  # fmt: skip
        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")])
        )
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"{world}-rank benchmark timed out after {timeout:.0f} s") from None
        if not out.exists():  # the verdict is the file: a healthy gloo run can abort at exit
            raise RuntimeError(f"{world}-rank benchmark failed (rc {proc.returncode}):\n{output}")
        return dict(json.loads(out.read_text()))


def hook_rows(runs: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The DDP hook alone: medians per step, with and without it, wall and CPU."""
    rows = []
    for world, run in runs.items():
        hook = run.get("ddp_hook_s") or {}
        if not hook:
            continue
        med = {k: statistics.median(v) * 1e6 for k, v in hook.items()}
        rows.append(
            {
                "ranks": world,
                **{f"{k}_us": round(v, 1) for k, v in med.items()},
                "wall_extra_us": round(med["on_wall"] - med["off_wall"], 1),
                "cpu_extra_us": round(med["on_cpu"] - med["off_cpu"], 1),
            }
        )
    return rows


def _quartiles(values: list[float]) -> list[float]:
    """The first and third quartiles (the spread of the paired ratios)."""
    if len(values) < 2:
        return [values[0], values[0]] if values else []
    q = statistics.quantiles(values, n=4)
    return [round(q[0], 3), round(q[2], 3)]


def summarise(runs: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, ranks): medians, on/off ratios, and the parts against the step.

    The parts are what telemetry adds to a step, each timed apart: the marks (and the
    records and writes) and, on 2 ranks, the DDP hook's extra CPU time (none when negative:
    noise). The goal is judged on them: the whole-run ratio's spread between repetitions on
    a shared 2-core machine (its quartiles are in the row) is wider than the goal.
    """
    hooks = {h["ranks"]: max(h["cpu_extra_us"], 0.0) for h in hook_rows(runs)}
    rows = []
    for world, run in runs.items():
        marks = statistics.median(run["marks_us"])
        for model in run["wall_s"]:
            wall = {s: statistics.median(run["wall_s"][model][s]) for s in SIDES}
            cpu = {s: statistics.median(run["cpu_s"][model][s]) for s in SIDES}
            parts = marks + hooks.get(world, 0.0)
            share = parts / (wall["off"] * 1e6)
            wall_s, cpu_s = run["wall_s"][model], run["cpu_s"][model]
            paired = [a / b for a, b in zip(wall_s["on"], wall_s["off"], strict=True)]
            paired_cpu = [a / b for a, b in zip(cpu_s["on"], cpu_s["off"], strict=True)]
            aa = [a / b for a, b in zip(cpu_s.get("off_again", []), cpu_s["off"], strict=False)]
            rows.append(
                {
                    "model": model,
                    "ranks": world,
                    "off_ms": round(wall["off"] * 1e3, 4),
                    "on_ms": round(wall["on"] * 1e3, 4),
                    "wall_ratio": round(wall["on"] / wall["off"], 4),
                    "off_cpu_ms": round(cpu["off"] * 1e3, 4),
                    "on_cpu_ms": round(cpu["on"] * 1e3, 4),
                    "cpu_ratio": round(cpu["on"] / cpu["off"], 4),
                    "wall_ratio_quartiles": _quartiles(paired),
                    "cpu_ratio_quartiles": _quartiles(paired_cpu),
                    "aa_cpu_ratio": round(statistics.median(aa), 4) if aa else None,
                    "aa_cpu_ratio_quartiles": _quartiles(aa),
                    "marks_us": round(marks, 2),
                    "parts_us": round(parts, 2),
                    "parts_share": round(share, 5),
                    "goal_share": GOALS[model],
                    "goal_met_by_parts": share <= GOALS[model],
                    "wall_samples_ms": {
                        s: [round(x * 1e3, 4) for x in v] for s, v in run["wall_s"][model].items()
                    },
                    "cpu_samples_ms": {
                        s: [round(x * 1e3, 4) for x in v] for s, v in run["cpu_s"][model].items()
                    },
                }
            )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'model':<6}{'ranks':>6}{'off ms':>10}{'on ms':>10}{'wall':>8}{'off CPU':>10}"
        f"{'on CPU':>10}{'CPU':>8}{'CPU q1-q3':>14}{'A/A CPU':>9}{'parts us':>10}{'share':>8}  goal"
    )
    for r in rows:
        goal = "met" if r["goal_met_by_parts"] else "MISSED"
        q1, q3 = r["cpu_ratio_quartiles"] or [float("nan")] * 2
        print(
            f"{r['model']:<6}{r['ranks']:>6}{r['off_ms']:>10.3f}{r['on_ms']:>10.3f}"
            f"{r['wall_ratio']:>7.3f}x{r['off_cpu_ms']:>10.3f}{r['on_cpu_ms']:>10.3f}"
            f"{r['cpu_ratio']:>7.3f}x{q1:>7.2f}-{q3:<5.2f} {r['aa_cpu_ratio'] or math.nan:>8.3f}x"
            f"{r['parts_us']:>10.2f}"
            f"{r['parts_share']:>8.2%}"
            f"  <= {r['goal_share']:.0%} ({goal})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps, 2 repetitions")
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions (7)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/telemetry.json")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per world size")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument(
        "--ranks", nargs="+", type=int, choices=WORLD_SIZES, default=list(WORLD_SIZES)
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    reps = args.reps if args.reps is not None else (2 if args.quick else 7)
    if args.worker:
        assert args.out is not None
        worker(reps, args.quick, args.out, tuple(args.models))
        return 0
    load_before = os.getloadavg()
    started = time.perf_counter()
    models = tuple(args.models)
    runs = {w: launch(w, reps, args.quick, args.timeout, models) for w in args.ranks}
    load_after = os.getloadavg()
    rows = summarise(runs)
    hooks = hook_rows(runs)
    result = {
        "benchmark": "telemetry",
        "quick": args.quick,
        "reps": reps,
        "date": date.today().isoformat(),
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
        "ddp_hook": hooks,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_average_1min": [round(load_before[0], 2), round(load_after[0], 2)],
        },
    }
    print(
        f"{reps} interleaved repetitions, medians per step (warm-up excluded), fp32 CPU; "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}"
    )
    print_table(rows)
    for h in hooks:
        print(
            f"DDP hook alone, {h['ranks']} ranks, bare MLP step: {h['off_wall_us']:.0f} -> "
            f"{h['on_wall_us']:.0f} us wall ({h['wall_extra_us']:+.0f}), {h['off_cpu_us']:.0f} -> "
            f"{h['on_cpu_us']:.0f} us CPU ({h['cpu_extra_us']:+.0f})"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
