"""Trainer overhead: ``Trainer(job).fit()`` against a hand-written PyTorch loop, same job.

Both sides train the same model on the same data with the same global batch, precision
(fp32 on CPU), optimizer (AdamW), gradient clipping (1.0), LR schedule (warmup + cosine,
a ``LambdaLR`` in the hand-written loop), step count and log interval (loss averaged over
ranks every ``log_every`` steps):

- ``trainer``: ``Trainer(job, task=...).fit()`` with strategy ``none`` (1 rank) or ``ddp``
  (2 ranks); evaluation, plot, TensorBoard and progress bar off; ``checkpoint.every`` past
  the last step (the one final save happens after the timed window);
- ``manual``: what a user writes by hand: the plain model (``DistributedDataParallel(model)``
  on 2 ranks), a ``DataLoader`` with a ``DistributedSampler``, ``AdamW``,
  ``loss.backward()``, ``clip_grad_norm_``, ``optimizer.step()``, ``scheduler.step()``,
  ``zero_grad()``, and an ``all_reduce`` of the loss at each log step.

Two models: the built-in char transformer (2 layers x 128, block 64) and a tiny MLP (where a
fixed per-step cost shows most), on 1 rank and 2 gloo ranks.

How a step is timed: both loops call the same instrumented loss function, which records
``time.perf_counter()`` on every call (the same point of every iteration, right after the
forward pass). A run's step time is ``(t[last] - t[warmup]) / (last - warmup)`` on rank 0:
the first ``warmup`` steps are excluded, every later step counts in full (log steps
included, so a periodic cost is not hidden by a median), and set-up and the final
checkpoint fall outside the window. The same window is also measured in process CPU time
(``time.process_time()``, all threads, gloo's included): on a shared machine wall-clock
time mostly measures the other jobs, CPU time barely moves. Each process runs the
repetitions interleaved (trainer, manual, then manual, trainer, ...); the table shows the
median over repetitions and the ratio of medians, for both clocks.

Usage::

    python benchmarks/bench_trainer.py [--quick] [--reps 7] [--json PATH]

The script starts itself once per world size under
``python -m torch.distributed.run --standalone --nproc_per_node=N`` (``OMP_NUM_THREADS=1``).
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
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # runs from a checkout without an install

from gpu_training.ddp import cleanup_distributed, init_distributed  # noqa: E402
from gpu_training.job import JobConfig  # noqa: E402
from gpu_training.schedule import warmup_cosine_factor  # noqa: E402
from gpu_training.tasks import Task, resolve_task  # noqa: E402
from gpu_training.trainer import Trainer  # noqa: E402

GOALS = {"charlm": 1.03, "mlp": 1.10}
MODELS = ("charlm", "mlp")
BASE_KINDS = ("trainer", "helpers", "manual")
FRAMEWORKS = {"accelerate": "accelerate", "fabric": "lightning_fabric"}
"""Other tools measured on the same model and data when installed (``make bench-env``: their own environment on the project's torch)."""


def available_kinds() -> tuple[str, ...]:
    """The loops to time: ours, the hand-written one, and each framework that is installed."""
    from importlib.util import find_spec

    return BASE_KINDS + tuple(k for k, mod in FRAMEWORKS.items() if find_spec(mod) is not None)


WORLD_SIZES = (1, 2)
CHARLM_OPTIONS = {"n_layer": 2, "n_embd": 128, "n_head": 4, "block_size": 64, "dropout": 0.0}
MLP_SHAPE = (32, 64, 10)  # inputs, hidden, classes


@dataclasses.dataclass(frozen=True)
class Plan:
    """Steps of one run of one model; the global batch is the same on 1 and 2 ranks."""

    steps: int
    warmup: int
    global_batch: int
    log_every: int


PLANS = {
    "charlm": Plan(steps=40, warmup=5, global_batch=16, log_every=10),
    "mlp": Plan(steps=300, warmup=30, global_batch=32, log_every=10),
}
QUICK_PLANS = {
    "charlm": Plan(steps=6, warmup=2, global_batch=16, log_every=3),
    "mlp": Plan(steps=40, warmup=10, global_batch=32, log_every=10),
}


# --- the two tasks ----------------------------------------------------------------------------


def mlp_task(num_samples: int) -> Task:
    """A 2-layer MLP classifier on random data (fixed seed): 2.8 k parameters."""
    n_in, hidden, n_out = MLP_SHAPE
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(num_samples, n_in, generator=gen)
    targets = torch.randint(0, n_out, (num_samples,), generator=gen)
    data = TensorDataset(inputs, targets)
    return Task(
        name="mlp",
        build_model=lambda: nn.Sequential(
            nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out)
        ),
        build_data=lambda: (data, None),
        loss_fn=F.cross_entropy,
        describe=f"MLP {n_in}-{hidden}-{n_out} on random data",
    )


def build_tasks(plans: dict[str, Plan]) -> dict[str, Task]:
    mlp = plans["mlp"]
    return {
        "charlm": resolve_task("charlm", CHARLM_OPTIONS),
        # one epoch covers every step: no epoch boundary inside a run, on either side
        "mlp": mlp_task(mlp.global_batch * (mlp.steps + 1)),
    }


class StepClock:
    """The task's loss function, recording wall and CPU time at each call (once per step)."""

    def __init__(self, loss_fn: Callable[[Tensor, Tensor], Tensor]) -> None:
        self.loss_fn = loss_fn
        self.times: list[float] = []
        self.cpu_times: list[float] = []

    def __call__(self, outputs: Tensor, targets: Tensor) -> Tensor:
        self.times.append(time.perf_counter())
        self.cpu_times.append(time.process_time())
        return self.loss_fn(outputs, targets)

    def step_seconds(self, steps: int, warmup: int, *, cpu: bool = False) -> float:
        """Mean seconds per step after ``warmup`` steps (later calls, e.g. evaluation, dropped).

        ``cpu=True``: this process's CPU seconds (all its threads, gloo's included) instead
        of wall-clock seconds; other jobs on the machine barely move it.
        """
        times = (self.cpu_times if cpu else self.times)[:steps]
        if len(times) < steps or steps - 1 <= warmup:
            raise RuntimeError(f"expected {steps} training steps, timed {len(times)}")
        return (times[-1] - times[warmup]) / (steps - 1 - warmup)

    def timing(self, steps: int, warmup: int) -> tuple[float, float]:
        """``(wall, cpu)`` seconds per step."""
        return self.step_seconds(steps, warmup), self.step_seconds(steps, warmup, cpu=True)


# --- the two loops ----------------------------------------------------------------------------


def job_for(model: str, plan: Plan, world: int, out_dir: str) -> JobConfig:
    return JobConfig.from_dict(
        {
            "task": "charlm",  # replaced by the Task given to the Trainer
            "task_options": CHARLM_OPTIONS if model == "charlm" else {},
            "training": {
                "global_batch_size": plan.global_batch,
                "per_device_batch_size": plan.global_batch // world,
                "max_steps": plan.steps,
                "learning_rate": 1e-3,
                "warmup_steps": 2,
                "precision": "fp32",
                "max_grad_norm": 1.0,
                "weight_decay": 0.01,
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
            },
        }
    )


def run_trainer(task: Task, model: str, plan: Plan, world: int) -> tuple[float, float]:
    clock = StepClock(task.loss_fn)
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as out_dir:
        job = job_for(model, plan, world, out_dir)
        Trainer(job, task=dataclasses.replace(task, loss_fn=clock), quiet=True).fit()
    return clock.timing(plan.steps, plan.warmup)


def _torch_parts(
    task: Task, model_name: str, plan: Plan, world: int
) -> tuple[Any, nn.Module, Any, torch.optim.Optimizer, Any]:
    """The config, model, dataset, AdamW and warmup-cosine ``LambdaLR`` every loop starts from."""
    cfg = job_for(model_name, plan, world, "unused").training.for_world_size(world)
    torch.manual_seed(cfg.seed)
    model = task.build_model()
    train_ds, _ = task.build_data()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.scaled_learning_rate, weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine_factor(s, cfg.warmup_steps, plan.steps, 0.0)
    )
    return cfg, model, train_ds, optimizer, scheduler


def run_manual(task: Task, model_name: str, plan: Plan, world: int) -> tuple[float, float]:
    rank = dist.get_rank() if world > 1 else 0
    cfg, model, train_ds, optimizer, scheduler = _torch_parts(task, model_name, plan, world)
    clock = StepClock(task.loss_fn)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)  # same parameters, same optimizer
    sampler: DistributedSampler[Any] = DistributedSampler(
        train_ds, num_replicas=world, rank=rank, seed=cfg.seed
    )
    loader = DataLoader(
        train_ds, batch_size=cfg.per_device_batch_size, sampler=sampler, drop_last=True
    )
    step = 0
    while step < plan.steps:
        for inputs, targets in loader:
            loss = clock(model(inputs), targets)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % plan.log_every == 0 or step == plan.steps:
                logged = loss.detach().clone()
                if world > 1:
                    dist.all_reduce(logged)
                    logged /= world
                _ = float(logged)  # what a user prints
            if step >= plan.steps:
                break
        sampler.set_epoch(sampler.epoch + 1)
    return clock.timing(plan.steps, plan.warmup)


def run_helpers(task: Task, model_name: str, plan: Plan, world: int) -> tuple[float, float]:
    """The toolkit's helpers in a hand-written loop: ``prepare`` + ``GlobalBatchSampler``."""
    from gpu_training.data import GlobalBatchSampler
    from gpu_training.ddp import DistributedContext, reduce_scalar_dict
    from gpu_training.schedule import linear_warmup_cosine_lr
    from gpu_training.strategy import prepare

    ctx = DistributedContext.from_env()
    cfg = job_for(model_name, plan, world, "unused").training.for_world_size(world)
    clock = StepClock(task.loss_fn)
    torch.manual_seed(cfg.seed)
    run = prepare(task.build_model(), "ddp" if world > 1 else "none", ctx, cfg)
    scheduler = linear_warmup_cosine_lr(run.optimizer, cfg.warmup_steps, plan.steps, 0.0)
    train_ds, _ = task.build_data()
    sampler = GlobalBatchSampler(
        len(train_ds),  # type: ignore[arg-type]  # a map-style dataset
        cfg.effective_batch_size,
        cfg.per_device_batch_size,
        ctx,
        seed=cfg.seed,
    )
    loader = DataLoader(train_ds, batch_sampler=sampler)
    step = 0
    while step < plan.steps:
        for micro, (inputs, targets) in enumerate(loader):
            with run.steps.sync(micro), run.steps.autocast():
                loss = clock(run.model(inputs), targets)
            run.steps.backward(loss)
            if run.steps.step_async(micro) is None:
                continue
            scheduler.step()
            step += 1
            if step % plan.log_every == 0 or step == plan.steps:
                reduce_scalar_dict({"loss": loss.detach()}, ctx)
            if step >= plan.steps:
                break
        sampler.set_epoch(sampler.epoch + 1)
    return clock.timing(plan.steps, plan.warmup)


def run_accelerate(task: Task, model_name: str, plan: Plan, world: int) -> tuple[float, float]:
    """HF Accelerate's documented loop on the same model, data, optimizer and schedule."""
    from accelerate import Accelerator

    cfg, model, train_ds, optimizer, scheduler = _torch_parts(task, model_name, plan, world)
    clock = StepClock(task.loss_fn)
    accelerator = Accelerator(cpu=True, step_scheduler_with_optimizer=False)
    loader = DataLoader(
        train_ds, batch_size=cfg.per_device_batch_size, shuffle=True, drop_last=True
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    step = 0
    while step < plan.steps:
        for inputs, targets in loader:
            loss = clock(model(inputs), targets)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % plan.log_every == 0 or step == plan.steps:
                _ = float(accelerator.reduce(loss.detach(), "mean"))
            if step >= plan.steps:
                break
    return clock.timing(plan.steps, plan.warmup)


def run_fabric(task: Task, model_name: str, plan: Plan, world: int) -> tuple[float, float]:
    """Lightning Fabric's documented loop on the same model, data, optimizer and schedule."""
    from lightning_fabric import Fabric

    cfg, model, train_ds, optimizer, scheduler = _torch_parts(task, model_name, plan, world)
    clock = StepClock(task.loss_fn)
    fabric = Fabric(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        precision="32-true",
    )
    fabric.launch()  # under torchrun: joins the existing process group, starts nothing
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(
        DataLoader(train_ds, batch_size=cfg.per_device_batch_size, shuffle=True, drop_last=True)
    )
    step = 0
    while step < plan.steps:
        for inputs, targets in loader:
            loss = clock(model(inputs), targets)
            fabric.backward(loss)
            fabric.clip_gradients(model, optimizer, max_norm=1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % plan.log_every == 0 or step == plan.steps:
                mean = fabric.all_reduce(loss.detach(), reduce_op="mean")
                assert isinstance(mean, torch.Tensor)
                _ = float(mean)
            if step >= plan.steps:
                break
    return clock.timing(plan.steps, plan.warmup)


RUNNERS: dict[str, Callable[[Task, str, Plan, int], tuple[float, float]]] = {
    "trainer": run_trainer,
    "helpers": run_helpers,
    "manual": run_manual,
    "accelerate": run_accelerate,
    "fabric": run_fabric,
}


def worker(reps: int, quick: bool, out: Path) -> None:
    """One rank: every (model, kind) ``reps`` times, interleaved; rank 0 writes ``out``."""
    ctx = init_distributed()
    plans = QUICK_PLANS if quick else PLANS
    tasks = build_tasks(plans)
    kinds = available_kinds()
    samples: dict[str, dict[str, list[float]]] = {m: {k: [] for k in kinds} for m in MODELS}
    cpu: dict[str, dict[str, list[float]]] = {m: {k: [] for k in kinds} for m in MODELS}
    try:
        for rep in range(reps):
            for model in MODELS:
                shift = rep % len(kinds)  # rotate: no loop always runs right after another
                order = kinds[shift:] + kinds[:shift]
                for kind in order:
                    gc.collect()
                    if ctx.is_distributed:
                        dist.barrier()  # every rank starts the run together
                    wall, cpu_s = RUNNERS[kind](tasks[model], model, plans[model], ctx.world_size)
                    samples[model][kind].append(wall)
                    cpu[model][kind].append(cpu_s)
        if ctx.is_main_process:
            payload = {
                "world_size": ctx.world_size,
                "kinds": list(kinds),
                "plans": {m: dataclasses.asdict(p) for m, p in plans.items()},
                "samples_s": samples,
                "cpu_samples_s": cpu,
            }
            out.write_text(json.dumps(payload))  # before cleanup: gloo may abort at exit
    finally:
        cleanup_distributed()


# --- the driver ---------------------------------------------------------------------------


def launch(world: int, reps: int, quick: bool, timeout: float) -> dict[str, Any]:
    """Runs the worker on ``world`` ranks under torchrun; returns rank 0's results."""
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={world}", str(Path(__file__).resolve()),
            "--worker", "--reps", str(reps), "--out", str(out),
        ] + (["--quick"] if quick else [])  # fmt: skip
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
        # The verdict is the result file, not the exit code (a healthy gloo run can abort at exit).
        if not out.exists():
            raise RuntimeError(f"{world}-rank benchmark failed (rc {proc.returncode}):\n{output}")
        return dict(json.loads(out.read_text()))


def summarise(runs: dict[int, dict[str, Any]], reps: int, quick: bool) -> dict[str, Any]:
    rows = []
    for model in MODELS:
        for world in WORLD_SIZES:
            kinds = runs[world]["kinds"]
            samples = runs[world]["samples_s"][model]
            cpu = runs[world]["cpu_samples_s"][model]
            med = {k: statistics.median(samples[k]) for k in kinds}
            best = {k: min(samples[k]) for k in kinds}
            cpu_med = {k: statistics.median(cpu[k]) for k in kinds}
            ratio = med["trainer"] / med["manual"]
            rows.append(
                {
                    "model": model,
                    "ranks": world,
                    "trainer_ms": round(med["trainer"] * 1e3, 4),
                    "manual_ms": round(med["manual"] * 1e3, 4),
                    "ratio": round(ratio, 4),
                    "ratio_of_fastest": round(best["trainer"] / best["manual"], 4),
                    "trainer_cpu_ms": round(cpu_med["trainer"] * 1e3, 4),
                    "manual_cpu_ms": round(cpu_med["manual"] * 1e3, 4),
                    "cpu_ratio": round(cpu_med["trainer"] / cpu_med["manual"], 4),
                    "goal": GOALS[model],
                    "goal_met": ratio <= GOALS[model],
                    "cpu_goal_met": cpu_med["trainer"] / cpu_med["manual"] <= GOALS[model],
                    "kinds": {
                        k: {
                            "ms": round(med[k] * 1e3, 4),
                            "cpu_ms": round(cpu_med[k] * 1e3, 4),
                            "ratio": round(med[k] / med["manual"], 4),
                            "cpu_ratio": round(cpu_med[k] / cpu_med["manual"], 4),
                        }
                        for k in kinds
                    },
                    "samples_ms": {k: [round(x * 1e3, 4) for x in samples[k]] for k in kinds},
                    "cpu_samples_ms": {k: [round(x * 1e3, 4) for x in cpu[k]] for k in kinds},
                }
            )
    return {
        "benchmark": "trainer",
        "quick": quick,
        "reps": reps,
        "kinds": runs[WORLD_SIZES[0]]["kinds"],
        "plans": runs[WORLD_SIZES[0]]["plans"],
        "charlm_options": CHARLM_OPTIONS,
        "mlp_shape": list(MLP_SHAPE),
        "rows": rows,
    }


def print_table(result: dict[str, Any]) -> None:
    """One line per (model, ranks, loop): medians and ratios to the hand-written loop."""
    print(
        f"{'model':<8}{'ranks':>6}  {'loop':<11}{'wall ms':>10}{'ratio':>9}{'CPU ms':>10}{'ratio':>9}"
    )
    for row in result["rows"]:
        for kind, fig in row["kinds"].items():
            goal = ""
            if kind == "trainer":
                wall = "met" if row["goal_met"] else "MISSED"
                cpu = "met" if row["cpu_goal_met"] else "MISSED"
                goal = f"   goal <= {row['goal']:.2f}x (wall {wall}, CPU {cpu})"
            print(
                f"{row['model']:<8}{row['ranks']:>6}  {kind:<11}{fig['ms']:>10.3f}"
                f"{fig['ratio']:>8.3f}x{fig['cpu_ms']:>10.3f}{fig['cpu_ratio']:>8.3f}x{goal}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps, 2 repetitions (< 60 s)")
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions (>= 5)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/trainer.json")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per world size")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    reps = args.reps if args.reps is not None else (2 if args.quick else 7)
    if args.worker:
        assert args.out is not None
        worker(reps, args.quick, args.out)
        return 0
    if reps < 5 and not args.quick:
        parser.error("--reps must be >= 5 (or use --quick)")

    load_before = os.getloadavg()
    started = time.perf_counter()
    runs = {w: launch(w, reps, args.quick, args.timeout) for w in WORLD_SIZES}
    load_after = os.getloadavg()
    result = summarise(runs, reps, args.quick)
    result["date"] = date.today().isoformat()
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["machine"] = {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_1min": [round(load_before[0], 2), round(load_after[0], 2)],
    }

    print(
        f"{reps} interleaved repetitions, medians of per-step time (warm-up excluded), fp32 CPU; "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}"
    )
    print_table(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json} ({result['seconds']:.0f} s)")
    if any(not math.isfinite(r["ratio"]) for r in result["rows"]):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
