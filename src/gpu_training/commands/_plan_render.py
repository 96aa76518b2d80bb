"""The text ``gpu-training plan`` prints (``--json`` prints the same result as JSON).

The memory table of every candidate strategy, the time and cost when asked for, the
recommendation with its reason, the batch, the learning rate and the launch command.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from gpu_training.commands import _plan_cost
from gpu_training.commands._plan_recommend import JOB_FILE

__all__ = ["render"]

_PARTS = ("parameters", "gradients", "optimizer_state", "activations", "temporary")


def _count(n: int) -> str:
    for scale, unit in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _flow_yaml(data: dict[str, Any]) -> str:
    """``data`` as one line of YAML (flow style): a job file that fits on a line."""
    import yaml

    return str(yaml.safe_dump(data, default_flow_style=True, sort_keys=False, width=2**31)).strip()


def render(r: dict[str, Any], args: argparse.Namespace) -> str:
    """The plan's ``result`` (what ``--json`` prints) as the text ``plan`` prints."""
    from gpu_training.memory import format_bytes

    fmt = format_bytes
    usable = args.gpu_memory - args.overhead
    ckpt = "on" if r["activation_checkpointing"] else "off"
    lines = [
        f"model: {r['model']}",
        f"       {_count(r['num_params'])} parameters, {r['precision']}, "
        f"{r['optimizer']}; activations {r['method']}",
        f"GPUs:  {r['gpus']} x {fmt(args.gpu_memory)} ({fmt(usable)} usable after "
        f"{fmt(args.overhead)} overhead)",
        "",
        f"memory per GPU at per-device batch {r['micro_batch']} (activation checkpointing {ckpt}):",
        f"{'strategy':<15}{'params':>11}{'grads':>11}{'optim':>11}{'activ':>11}{'temp':>11}"
        f"{'total':>11}  fits",
    ]
    for name, row in r["candidates"].items():
        lines.append(
            f"{name:<15}"
            + "".join(f"{fmt(row[k]):>11}" for k in (*_PARTS, "total"))
            + f"  {'yes' if row['fits'] else 'NO'}"
        )
    if any(
        sum(row[k] for k in _PARTS) > row["total"] - row["overhead"]
        for row in r["candidates"].values()
    ):
        lines.append(
            "(totals are the step's peak: activations are freed as gradients appear, so the "
            "parts can add up to more)"
        )
    rec = r["recommended"]
    tp = r["tensor_parallel"]
    if tp is not None:
        row = r["candidates"][tp["name"]]
        lines.append(
            f"({tp['name']}: at per-device batch {row['per_device_batch']} of each group of "
            f"{tp['name'].rsplit('tp', 1)[1]} GPUs, which share its samples; activation "
            f"checkpointing {'on' if row['activation_checkpointing'] else 'off'})"
        )
    if r["time"] is not None:
        lines += ["", *_plan_cost.render(r["time"])]
    name = {"none": "single GPU", "ddp": "DDP", "fsdp": "FSDP"}.get(rec["strategy"])
    if name is None:
        name = f"DeepSpeed ZeRO-{rec['zero_stage']} + CPU offload of the {rec['offload']}"
    if rec["tensor_parallel"] > 1:
        name += f" + tensor parallel {rec['tensor_parallel']} (2-D)"
    extra = " + activation checkpointing" if rec["activation_checkpointing"] else ""
    fits = "" if rec["fits"] else "  (does NOT fit)"
    lines += [
        "",
        f"recommended: {name}{extra}{fits}",
        f"  decided at per-device batch {r['decision_batch']}: {rec['reason']}",
    ]
    if tp is not None and not rec["tensor_parallel"] > 1:
        lines.append(f"  not recommended: {tp['reason']}")
    b = r["batch"]
    groups = f"{r['gpus']} GPUs"
    if rec["tensor_parallel"] > 1:
        groups = f"{b['data_parallel']} groups of {rec['tensor_parallel']} GPUs"
    lines.append(
        f"batch: per-device {b['per_device']} x accumulation {b['gradient_accumulation_steps']} "
        f"x {groups} = global {b['global']} ({b['note']})"
    )
    lr = r["learning_rate"]
    if lr is not None:
        lines.append(
            f"learning rate: {lr['lr']:.4g} ({lr['rule']} scaling of {lr['base_lr']:g} from "
            f"batch {lr['base_batch']} to {lr['global_batch']})"
        )
    per_node = args.gpus_per_node or min(args.gpus, 8)
    nnodes = math.ceil(args.gpus / per_node)
    if len(r["launch"]) == 1 and nnodes > 1:
        lines.append(
            f"launch (the same line on each of the {nnodes} nodes; HEAD_NODE: the first one):"
        )
    else:
        lines.append("launch:")
    lines += [f"  {c}" for c in r["launch"]]
    if r["job_file"] is not None:
        lines.append(f"  {JOB_FILE}: {_flow_yaml(r['job_file'])}")
    else:
        lines.append(f"  job file: strategy: {_flow_yaml(rec['strategy_config'])}")
    lines += [f"note: {n}" for n in r["notes"]]
    if r["plot"] is not None:
        lines.append(f"plot: {r['plot']}")
    return "\n".join(lines)
