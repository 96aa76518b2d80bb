"""GPU performance: the built-in transformer at GPT-2 124M shape, Trainer vs hand-written loop.

One prepared run for a machine with one NVIDIA GPU (``make bench-gpu``, under 8 minutes):

1. The same model — 12 layers, 768 wide, 12 heads, T = 1024, vocabulary padded to 50304,
   weight tying, SDPA attention — trained for ``--steps`` steps by ``Trainer(job).fit()``
   and by a hand-written loop, interleaved (trainer, manual, manual, trainer...), both with
   bf16 autocast, fused AdamW, TF32, ``torch.compile`` (``--no-compile`` to switch it off),
   pinned memory and non-blocking copies, and no host sync except every ``log_every`` steps.
2. For each: tokens/s over the steps after warm-up (compilation excluded), MFU with
   ``6N + 12·L·H·Q·T`` FLOPs per token (N = non-embedding parameters) against the GPU's
   dense bf16 peak, and peak memory (``torch.cuda.max_memory_allocated``) against
   :func:`gpu_training.memory.estimate_memory` for the same model and batch.
3. With 2 GPUs or more, the TP row (benchmarks/bench_tensor_parallel.py on 2 ranks, NCCL):
   a 2-D step (FSDP × TP 2) ÷ an FSDP step on the same 2 GPUs, a 6-layer 768-wide model in
   bf16; with fewer it says ``skipped: needs 2 GPUs`` (``--no-tp`` leaves it out).
4. The GPU tier of the tests (``pytest -m "requires_cuda or requires_gpus"``), unless
   ``--no-tests``.

Usage::

    python benchmarks/bench_gpu.py [--steps 300] [--batch 16] [--reps 2] [--json PATH]

Without a CUDA device it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # runs from a checkout without an install

from gpu_training.job import JobConfig  # noqa: E402
from gpu_training.schedule import warmup_cosine_factor  # noqa: E402
from gpu_training.tasks import Task, resolve_task  # noqa: E402
from gpu_training.trainer import Trainer  # noqa: E402

GPT2_SHAPE = {
    "n_layer": 12,
    "n_embd": 768,
    "n_head": 12,
    "block_size": 1024,
    "vocab_size": 50304,
    "dropout": 0.0,
}
SMOKE_SHAPE = {
    "n_layer": 2,
    "n_embd": 32,
    "n_head": 2,
    "block_size": 32,
    "vocab_size": 128,
    "dropout": 0.0,
}
"""``--smoke``: the same code paths on the CPU in seconds (a check of the script, no figures)."""
GOALS = {"mfu": 0.45, "mfu_floor": 0.35, "trainer_vs_manual": 1.02, "memory_error": 0.10}


@dataclasses.dataclass(frozen=True)
class Plan:
    steps: int
    warmup: int
    batch: int
    log_every: int
    compile: bool
    shape: dict[str, Any]
    device: str = "cuda"
    job_set: tuple[str, ...] = ()
    """``section.field=value`` overrides of the Trainer's job (``--job-set``)."""

    @property
    def precision(self) -> str:
        return "bf16" if self.device == "cuda" else "fp32"


def _peak_memory(device: str) -> float:
    return float(torch.cuda.max_memory_allocated()) if device == "cuda" else float("nan")


def _reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _job(plan: Plan, out_dir: str) -> JobConfig:
    import yaml

    data = _job_dict(plan, out_dir)
    for item in plan.job_set:
        dotted, _, value = item.partition("=")
        section, _, field = dotted.partition(".")
        data.setdefault(section, {})[field] = yaml.safe_load(value)
    return JobConfig.from_dict(data)


def _job_dict(plan: Plan, out_dir: str) -> dict[str, Any]:
    return {
        "task": "charlm",
        "task_options": plan.shape,
        "training": {
            "global_batch_size": plan.batch,
            "per_device_batch_size": plan.batch,
            "max_steps": plan.steps,
            "learning_rate": 6e-4,
            "warmup_steps": 10,
            "precision": plan.precision,
            "max_grad_norm": 1.0,
            "weight_decay": 0.1,
            "seed": 0,
        },
        "strategy": {"name": "none"},
        "checkpoint": {"every": plan.steps + 1, "resume": False, "keep_last_n": 1},
        "run": {
            "output_dir": out_dir,
            "log_every": plan.log_every,
            "eval_every": plan.steps + 1,
            "eval_batches": 1,
            "progress": False,
            "plot": False,
            "tensorboard": False,
            "compile": plan.compile,
        },
    }


def run_trainer(task: Task, plan: Plan) -> dict[str, float]:
    """Tokens/s from the Trainer's own log windows after warm-up, and peak memory."""
    _reset_peak(plan.device)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as out_dir:
        Trainer(_job(plan, out_dir), task=task, quiet=True).fit()
        rows = [
            json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()
        ]
    windows = [r for r in rows if r.get("split") == "train" and r["step"] > plan.warmup]
    tokens_s = statistics.median(r["tokens_per_s"] for r in windows)
    return {"tokens_per_s": tokens_s, "peak_bytes": _peak_memory(plan.device)}


def run_manual(task: Task, plan: Plan) -> dict[str, float]:
    """nanoGPT's loop: the same model, data, optimizer, schedule, precision and compile."""
    _reset_peak(plan.device)
    device = torch.device(plan.device)
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = cuda
    torch.backends.cudnn.allow_tf32 = cuda
    torch.manual_seed(0)
    model = task.build_model().to(device)
    if plan.compile:
        model.compile()
    train_ds, _ = task.build_data()
    loader = torch.utils.data.DataLoader(
        train_ds, batch_size=plan.batch, shuffle=True, drop_last=True, pin_memory=cuda
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=cuda)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine_factor(s, 10, plan.steps, 0.0)
    )
    rates: list[float] = []
    step, window_start = 0, time.perf_counter()
    while step < plan.steps:
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=cuda)
            targets = targets.to(device, non_blocking=cuda)
            with autocast:
                loss = task.loss_fn(model(inputs), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % plan.log_every == 0:
                _ = float(loss.detach())  # the one sync per window, as the Trainer does
                now = time.perf_counter()
                if step > plan.warmup:
                    tokens = plan.log_every * plan.batch * plan.shape["block_size"]
                    rates.append(tokens / (now - window_start))
                window_start = now
            if step >= plan.steps:
                break
    return {"tokens_per_s": statistics.median(rates), "peak_bytes": _peak_memory(plan.device)}


def estimated_bytes(task: Task, plan: Plan) -> int:
    """The planner's estimate of the peak allocated bytes for this model and batch."""
    from gpu_training.memory import estimate_memory

    model = task.build_model()
    block = plan.shape["block_size"]

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, 64, (n, block + 1))
        return tokens[:, :-1], tokens[:, 1:]

    estimate = estimate_memory(
        model,
        make_batch=make_batch,
        loss_fn=task.loss_fn,
        batch_size=plan.batch,
        precision=plan.precision,
        optimizer="adamw",
        strategy="none",
        device=plan.device,
    )
    return int(estimate.allocated)


def tp_row(reps: int, steps: int) -> dict[str, Any]:
    """bench_tensor_parallel.py's row on 2 GPUs (torchrun, NCCL), or why it was skipped."""
    if torch.cuda.device_count() < 2:
        print("TP row: skipped: needs 2 GPUs")
        return {"skipped": "needs 2 GPUs"}
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_tensor_parallel as tp_bench

    plan = tp_bench.Plan("gpt2-small", steps=steps, warmup=steps // 3, precision="bf16")
    row = tp_bench.launch(2, plan, reps, timeout=420)
    tp_bench.print_table([row], plan)
    return {"plan": dataclasses.asdict(plan), **row}


def run_gpu_tests() -> int:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "requires_cuda or requires_gpus"]
    print("$ " + " ".join(cmd[2:]), flush=True)
    return subprocess.run(cmd, cwd=ROOT, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50, help="steps left out of tokens/s")
    parser.add_argument("--batch", type=int, default=16, help="sequences of 1024 per step")
    parser.add_argument("--reps", type=int, default=2, help="interleaved repetitions")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-tests", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model on the CPU: checks the script only"
    )
    parser.add_argument("--no-tp", action="store_true", help="leave out the TP row (2 GPUs)")
    parser.add_argument("--tp-reps", type=int, default=2, help="TP row: alternated repetitions")
    parser.add_argument("--tp-steps", type=int, default=30, help="TP row: steps per run")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/gpu.json")
    parser.add_argument(
        "--job-set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a field of the Trainer's job (e.g. run.telemetry=false); repeatable",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print("bench_gpu: no CUDA device on this machine: nothing to measure")
        return 0
    if args.warmup >= args.steps or args.steps % args.log_every:
        parser.error("--warmup must be < --steps, and --steps a multiple of --log-every")

    plan = Plan(
        args.steps,
        args.warmup,
        args.batch,
        args.log_every,
        compile=not args.no_compile and not args.smoke,
        shape=SMOKE_SHAPE if args.smoke else GPT2_SHAPE,
        device="cpu" if args.smoke else "cuda",
        job_set=tuple(args.job_set),
    )
    task = resolve_task("charlm", plan.shape)
    assert task.flops_per_token is not None
    from gpu_training.profiling import peak_tflops

    name = torch.cuda.get_device_name() if plan.device == "cuda" else "CPU (smoke run)"
    peak = peak_tflops(name, "bf16") if plan.device == "cuda" else None
    started = time.perf_counter()
    results: dict[str, list[dict[str, float]]] = {"trainer": [], "manual": []}
    for rep in range(args.reps):
        for kind in ("trainer", "manual") if rep % 2 == 0 else ("manual", "trainer"):
            gc.collect()
            if plan.device == "cuda":
                torch.cuda.empty_cache()
            run = run_trainer if kind == "trainer" else run_manual
            results[kind].append(run(task, plan))
            print(
                f"rep {rep} {kind}: {results[kind][-1]['tokens_per_s']:,.0f} tokens/s", flush=True
            )
    estimate = estimated_bytes(task, plan)

    summary: dict[str, Any] = {
        "benchmark": "gpu",
        "date": date.today().isoformat(),
        "gpu": name,
        "torch": torch.__version__,
        "plan": dataclasses.asdict(plan),
        "shape": plan.shape,
        "flops_per_token": task.flops_per_token,
        "formula": "6N + 12*L*H*Q*T (N = non-embedding parameters)",
        "peak_bf16_tflops": peak,
        "estimate_bytes": estimate,
        "goals": GOALS,
        "seconds": 0.0,
        "rows": {},
    }
    seq = plan.shape["block_size"]
    print(f"{name}, torch {torch.__version__}, batch {plan.batch} x {seq}, compile {plan.compile}")
    print(f"{'loop':<9}{'tokens/s':>12}{'MFU':>8}{'peak GiB':>10}{'estimate':>10}{'error':>8}")
    for kind, runs in results.items():
        tokens_s = statistics.median(r["tokens_per_s"] for r in runs)
        peak_bytes = max(r["peak_bytes"] for r in runs)
        mfu = tokens_s * task.flops_per_token / (peak * 1e12) if peak else float("nan")
        error = estimate / peak_bytes - 1
        summary["rows"][kind] = {
            "tokens_per_s": tokens_s,
            "mfu": mfu,
            "peak_bytes": peak_bytes,
            "estimate_error": error,
            "samples": runs,
        }
        print(
            f"{kind:<9}{tokens_s:>12,.0f}{mfu:>8.1%}{peak_bytes / 2**30:>10.2f}"
            f"{estimate / 2**30:>10.2f}{error:>+8.1%}"
        )
    ratio = summary["rows"]["manual"]["tokens_per_s"] / summary["rows"]["trainer"]["tokens_per_s"]
    summary["trainer_step_time_vs_manual"] = ratio
    print(f"Trainer step time / hand-written: {ratio:.3f}x (goal <= {GOALS['trainer_vs_manual']})")
    if not args.no_tp:
        summary["tp"] = tp_row(args.tp_reps, args.tp_steps)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.json} ({summary['seconds']:.0f} s)")
    if args.no_tests or args.smoke:
        return 0
    return run_gpu_tests()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
