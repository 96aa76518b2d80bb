"""Tensor parallel's cost: a 2-D (FSDP × TP) step ÷ an FSDP step, same job, same run.

The built-in char transformer (bench_trainer.py's charlm: 2 layers × 128, block 64; the
plan splits each block's attention heads and MLP, colwise then rowwise) is trained by ``Trainer(job).fit()``
on the same ranks with the same global batch, precision (fp32 on CPUs), AdamW and clipping:

- ``fsdp``: ``strategy: {name: fsdp}`` over every rank;
- ``tp``: ``strategy: {name: fsdp, tensor_parallel: 2}``: TP 2 inside FSDP over the rest.

The two alternate inside one process group (fsdp, tp, tp, fsdp, ...); a step is timed as in
bench_trainer.py (:class:`bench_trainer.StepClock`: the loss function's call times, warm-up
steps left out) on rank 0, in wall-clock and process CPU seconds; the table shows medians
and the ratio of medians. On CPUs the ranks talk over gloo (TCP on loopback), not NVLink:
TP's two all-reduces of activations per block (forward and backward) dominate, so the ratio
here says what the 2-D wiring costs on this machine, not what it costs on GPUs
(bench_gpu.py's TP row measures that when 2 GPUs are lent).

Usage::

    python benchmarks/bench_tensor_parallel.py [--reps 3] [--four] [--json PATH]

``--four`` adds 4 ranks (FSDP over 4 vs 2 × 2). ``--shape gpt2-small --precision bf16``
is what bench_gpu.py runs on 2 GPUs (NCCL, chosen by the process group when CUDA is there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))  # runs from a checkout without an install
sys.path.insert(0, str(HERE))

from bench_trainer import CHARLM_OPTIONS, StepClock  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    "charlm": CHARLM_OPTIONS,
    "gpt2-small": {"n_layer": 6, "n_embd": 768, "n_head": 12, "block_size": 512, "dropout": 0.0},
}
"""``charlm``: the CPU row; ``gpt2-small``: a GPU row, wide enough for TP's split to matter."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """One measurement: the model shape, steps, global batch and precision."""

    shape: str = "charlm"
    steps: int = 30
    warmup: int = 5
    global_batch: int = 16
    precision: str = "fp32"


def job_dict(plan: Plan, world: int, tensor_parallel: int, out_dir: str) -> dict[str, Any]:
    """The job: FSDP over ``world`` ranks, TP ``tensor_parallel`` inside it (1: none)."""
    replicas = world // tensor_parallel
    strategy: dict[str, Any] = {"name": "fsdp", "block_classes": ["Block"]}
    if tensor_parallel > 1:
        strategy["tensor_parallel"] = tensor_parallel
    return {
        "task": "charlm",
        "task_options": SHAPES[plan.shape],
        "training": {
            "global_batch_size": plan.global_batch,
            "per_device_batch_size": plan.global_batch // replicas,
            "max_steps": plan.steps,
            "learning_rate": 1e-3,
            "warmup_steps": 2,
            "precision": plan.precision,
            "max_grad_norm": 1.0,
            "seed": 0,
        },
        "strategy": strategy,
        "checkpoint": {"every": plan.steps + 1, "resume": False, "keep_last_n": 1},
        "run": {
            "output_dir": out_dir,
            "log_every": 10,
            "eval_every": plan.steps + 1,
            "eval_batches": 1,
            "progress": False,
            "plot": False,
            "tensorboard": False,
        },
    }


def run_once(plan: Plan, world: int, tensor_parallel: int, out_dir: Path) -> tuple[float, float]:
    """``(wall, cpu)`` seconds per step of one Trainer run (every rank calls it; ``out_dir``
    shared by the ranks: the final save is a collective checkpoint)."""
    from gpu_training.job import JobConfig
    from gpu_training.tasks import resolve_task
    from gpu_training.trainer import Trainer

    task = resolve_task("charlm", SHAPES[plan.shape])
    clock = StepClock(task.loss_fn)  # charlm's loss is a mean: the Trainer calls loss_fn
    timed = dataclasses.replace(task, loss_fn=clock)
    job = JobConfig.from_dict(job_dict(plan, world, tensor_parallel, str(out_dir)))
    Trainer(job, task=timed, quiet=True).fit()
    return clock.timing(plan.steps, plan.warmup)


def worker(plan: Plan, reps: int, out: Path) -> None:
    """One rank: the two layouts alternated ``reps`` times; rank 0 writes the timings."""
    from gpu_training.ddp import cleanup_distributed, init_distributed

    ctx = init_distributed()
    try:
        times: dict[str, list[tuple[float, float]]] = {"fsdp": [], "tp": []}
        for rep in range(reps):
            order = ("fsdp", "tp") if rep % 2 == 0 else ("tp", "fsdp")
            for kind in order:
                run_dir = out.parent / f"{kind}-{rep}"  # the launcher's temporary directory
                tp = 2 if kind == "tp" else 1
                times[kind].append(run_once(plan, ctx.world_size, tp, run_dir))
        if ctx.is_main_process:
            out.write_text(json.dumps({"times": times, "backend": ctx.backend}))
    finally:
        cleanup_distributed()


def launch(world: int, plan: Plan, reps: int, timeout: float) -> dict[str, Any]:
    """Runs the worker on ``world`` ranks under torchrun; returns the summary of its timings."""
    with tempfile.TemporaryDirectory(prefix="bench-tp-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={world}", f"--log-dir={Path(tmp) / 'torchrun'}",
            str(Path(__file__).resolve()), "--worker", "--reps", str(reps), "--out", str(out),
            "--plan", json.dumps(dataclasses.asdict(plan)),
        ]  # fmt: skip
        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = "1"  # N ranks on few cores: oversubscribed OpenMP crawls
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
        if not out.exists():  # the verdict is the result file (gloo can abort at exit)
            raise RuntimeError(f"{world}-rank benchmark failed (rc {proc.returncode}):\n{output}")
        raw = json.loads(out.read_text())
    return summarise(raw["times"], world, raw["backend"])


def summarise(times: dict[str, list[list[float]]], world: int, backend: str) -> dict[str, Any]:
    """Medians per layout and the 2-D ÷ FSDP ratio of medians, wall and CPU."""
    row: dict[str, Any] = {"world": world, "layout": f"{world // 2} x TP 2", "backend": backend}
    for kind in ("fsdp", "tp"):
        row[f"{kind}_step_s"] = statistics.median(t[0] for t in times[kind])
        row[f"{kind}_cpu_step_s"] = statistics.median(t[1] for t in times[kind])
    row["ratio"] = row["tp_step_s"] / row["fsdp_step_s"]
    row["cpu_ratio"] = row["tp_cpu_step_s"] / row["fsdp_cpu_step_s"]
    row["reps"] = len(times["fsdp"])
    return row


def print_table(rows: list[dict[str, Any]], plan: Plan) -> None:
    print(
        f"charlm {plan.shape} {SHAPES[plan.shape]}, global batch {plan.global_batch}, "
        f"{plan.precision}, {plan.steps} steps ({plan.warmup} warm-up), medians"
    )
    print("| ranks | 2-D layout | FSDP step | 2-D step | 2-D / FSDP (wall) | (CPU time) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['world']} ({r['backend']}) | {r['layout']} | {r['fsdp_step_s'] * 1e3:.1f} ms "
            f"| {r['tp_step_s'] * 1e3:.1f} ms | {r['ratio']:.2f} | {r['cpu_ratio']:.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="alternated repetitions")
    parser.add_argument("--steps", type=int, default=Plan.steps)
    parser.add_argument("--warmup", type=int, default=Plan.warmup)
    parser.add_argument("--shape", choices=sorted(SHAPES), default=Plan.shape)
    parser.add_argument("--precision", default=Plan.precision)
    parser.add_argument("--four", action="store_true", help="also 4 ranks (2 x TP 2)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per world size")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(Plan(**json.loads(args.plan)), args.reps, args.out)
        return 0
    plan = Plan(args.shape, args.steps, args.warmup, precision=args.precision)
    rows = [
        launch(world, plan, args.reps, args.timeout) for world in ((2, 4) if args.four else (2,))
    ]
    print_table(rows, plan)
    print("gloo on CPUs is not NVLink: TP's all-reduces per block dominate; not a GPU figure")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"plan": dataclasses.asdict(plan), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
