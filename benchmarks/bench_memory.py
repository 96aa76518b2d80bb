"""Memory estimate accuracy: ``gpu_training.memory`` against real training steps.

For an MLP, a CNN and a transformer (the built-in character transformer), each at two batch
sizes, the estimate (measured on fake tensors at micro-batches 2 and 4, extrapolated) is
compared with two real AdamW steps on the CPU:

- parameters, gradients, optimizer state: unique storages after the step (goal: within 1%);
- activations: unique storages saved for backward, counted with ``saved_tensors_hooks``
  during the real step (goal: within 15%);
- total: the estimate's ``allocated`` against the live-tensor peak of the real step plus the
  parameters (no goal in the issue on the CPU; reported).

The transformer is also run in bf16 autocast and with activation checkpointing. With CUDA,
the same transformer (larger) is trained on the GPU and the total is compared with
``torch.cuda.max_memory_allocated`` of the second step (goal: within 10%).

Usage::

    python benchmarks/bench_memory.py [--json PATH] [--skip-cuda]

Prints a table of relative errors and writes JSON (default
``benchmarks/results/memory.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # runs from a checkout without an install

from gpu_training.memory import LiveTensorTracker, profile_memory  # noqa: E402
from gpu_training.tasks.charlm import CharLMConfig, CharTransformer  # noqa: E402
from gpu_training.tasks.charlm import loss_fn as lm_loss  # noqa: E402

GOALS = {"model_state": 0.01, "activations": 0.15, "cuda_total": 0.10}
PARTS = ("parameters", "gradients", "optimizer_state", "activations")
MakeBatch = Callable[[int], Sequence[torch.Tensor]]


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 10)
    )


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.BatchNorm2d(128),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def transformer(n_layer: int = 4, n_embd: int = 128, block: int = 128) -> CharTransformer:
    return CharTransformer(
        CharLMConfig(block_size=block, n_layer=n_layer, n_head=4, n_embd=n_embd), 96
    )


def _ids(block: int) -> MakeBatch:
    return lambda n: (torch.randint(96, (n, block)), torch.randint(96, (n, block)))


CASES: list[dict[str, Any]] = [
    {
        "name": "mlp",
        "build": mlp,
        "batch": lambda n: (torch.randn(n, 512), torch.randint(10, (n,))),
        "loss": nn.functional.cross_entropy,
        "batches": (16, 128),
    },
    {
        "name": "cnn",
        "build": cnn,
        "batch": lambda n: (torch.randn(n, 3, 32, 32), torch.randint(10, (n,))),
        "loss": nn.functional.cross_entropy,
        "batches": (8, 64),
    },
    {
        "name": "transformer",
        "build": transformer,
        "batch": _ids(128),
        "loss": lm_loss,
        "batches": (8, 32),
    },
    {
        "name": "transformer-bf16",
        "build": transformer,
        "batch": _ids(128),
        "loss": lm_loss,
        "batches": (8, 32),
        "dtype": torch.bfloat16,
    },
    {
        "name": "transformer-ckpt",
        "build": transformer,
        "batch": _ids(128),
        "loss": lm_loss,
        "batches": (8, 32),
        "ckpt": True,
    },
]


def _unique_bytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _forward(model: nn.Module, x: torch.Tensor, ckpt: bool) -> torch.Tensor:
    if not ckpt:
        out: torch.Tensor = model(x)
        return out
    assert isinstance(model, CharTransformer)
    h = model.drop(model.wte(x) + model.wpe(torch.arange(x.shape[1], device=x.device)))
    for block in model.blocks:
        h = checkpoint(block, h, use_reentrant=False)
    out = model.lm_head(model.ln_f(h))
    return out


def real_steps(
    case: dict[str, Any], model: nn.Module, batch: int, device: torch.device
) -> dict[str, int]:
    """Two real AdamW steps; bytes of the second (CPU: live-tensor peak; CUDA: allocator peak)."""
    torch.manual_seed(0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = case.get("dtype")
    keys = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in keys:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    tracker = LiveTensorTracker() if device.type == "cpu" else None
    grads = 0
    if tracker is not None:
        tracker.__enter__()
    try:
        for step in range(2):
            x, y = (t.to(device) for t in case["batch"](batch))
            if step == 1:
                if tracker is not None:
                    tracker.reset_peak()
                else:
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
            hooks = torch.autograd.graph.saved_tensors_hooks(
                pack if step == 1 else (lambda t: t), lambda t: t
            )
            autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
            with hooks, autocast:
                loss = case["loss"](_forward(model, x, case.get("ckpt", False)), y)
            loss.backward()
            del loss
            if step == 1:
                grads = _unique_bytes(p.grad for p in model.parameters())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            del x, y
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)
    params = _unique_bytes([*model.parameters(), *model.buffers()])
    if tracker is not None:
        peak = params + tracker.peak_bytes
    else:
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    on_device = [
        v
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.device.type == device.type
    ]
    return {
        "parameters": params,
        "gradients": grads,
        "optimizer_state": _unique_bytes(on_device),
        "activations": sum(saved.values()),
        "peak": peak,
    }


def _err(estimate: int, truth: int) -> float:
    return (estimate - truth) / truth if truth else 0.0


def measure(case: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    model = case["build"]().to(device)
    precision = "bf16" if case.get("dtype") == torch.bfloat16 else "fp32"
    began = time.perf_counter()
    profile = profile_memory(
        model,
        make_batch=case["batch"],
        loss_fn=case["loss"],
        precision=precision,
        device=device,
    )
    profile_s = time.perf_counter() - began
    rows = []
    for batch in case["batches"]:
        est = profile.estimate(
            batch, activation_checkpointing=case.get("ckpt", False), overhead_bytes=0
        )
        truth = real_steps(case, model, batch, device)
        errors = {p: _err(getattr(est, p), truth[p]) for p in PARTS}
        errors["total"] = _err(est.allocated, truth["peak"])
        rows.append(
            {
                "case": case["name"],
                "device": device.type,
                "batch": batch,
                "estimate": {**{p: getattr(est, p) for p in PARTS}, "allocated": est.allocated},
                "truth": truth,
                "errors": errors,
                "profile_seconds": round(profile_s, 3),
                "method": est.method,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/memory.json")
    parser.add_argument("--skip-cuda", action="store_true", help="CPU cases only")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

    rows: list[dict[str, Any]] = []
    for case in CASES:
        rows += measure(case, torch.device("cpu"))
    cuda = torch.cuda.is_available() and not args.skip_cuda
    if cuda:
        big = {
            "build": lambda: transformer(n_layer=8, n_embd=512, block=512),
            "batch": _ids(512),
            "loss": lm_loss,
            "batches": (4, 16),
        }
        rows += measure({**big, "name": "transformer-cuda"}, torch.device("cuda"))
        rows += measure(
            {**big, "name": "transformer-cuda-bf16", "dtype": torch.bfloat16},
            torch.device("cuda"),
        )

    header = f"{'case':<24}{'dev':<5}{'batch':>6}" + "".join(f"{p[:11]:>13}" for p in PARTS)
    print(header + f"{'total':>13}   (relative error of the estimate)")
    for r in rows:
        e = r["errors"]
        print(
            f"{r['case']:<24}{r['device']:<5}{r['batch']:>6}"
            + "".join(f"{e[p]:>+13.2%}" for p in (*PARTS, "total"))
        )
    state_err = max(abs(r["errors"][p]) for r in rows for p in PARTS[:3])
    act_err = max(abs(r["errors"]["activations"]) for r in rows)
    verdicts = {
        "model_state": state_err <= GOALS["model_state"],
        "activations": act_err <= GOALS["activations"],
    }
    print(
        f"goal model state within {GOALS['model_state']:.0%}: "
        f"{'met' if verdicts['model_state'] else 'MISSED'} (worst {state_err:.3%})"
    )
    print(
        f"goal activations within {GOALS['activations']:.0%}: "
        f"{'met' if verdicts['activations'] else 'MISSED'} (worst {act_err:.3%})"
    )
    cuda_rows = [r for r in rows if r["device"] == "cuda"]
    if cuda_rows:
        worst = max(abs(r["errors"]["total"]) for r in cuda_rows)
        verdicts["cuda_total"] = worst <= GOALS["cuda_total"]
        print(
            f"goal total within {GOALS['cuda_total']:.0%} of max_memory_allocated: "
            f"{'met' if verdicts['cuda_total'] else 'MISSED'} (worst {worst:.3%})"
        )
    else:
        print("CUDA: not available here; the total vs max_memory_allocated check did not run")

    result = {
        "benchmark": "memory",
        "date": date.today().isoformat(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "rows": rows,
        "goals": GOALS,
        "goals_met": verdicts,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
