"""``gpu-training plan``'s time and cost: its flags, the per-strategy table and the chart.

Given the hardware (``--gpu-type`` from :data:`gpu_training.hardware.GPU_TYPES`, or
``--hardware FILE``, each figure overridable by a flag) and, for hours and dollars, the
tokens or steps to train, :func:`cost_section` times one optimizer step of every strategy
with :mod:`gpu_training.cost` at the plan's own batch, and :func:`render` prints it beside the
memory table with the model's assumptions. :func:`write_plot` draws memory and time per
strategy (matplotlib, the ``plot`` extra). Private to :mod:`gpu_training.commands`; no torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_training.commands._sizing_inputs import (
    bounded_float,
    bounded_int,
    parse_bandwidth,
    parse_margin,
    parse_number,
)
from gpu_training.hardware import DEFAULT_MFU, GPU_TYPES, MFU_SOURCE, GPUSpec

if TYPE_CHECKING:
    from gpu_training.cost import TrainingRun

__all__ = ["CostRequest", "add_arguments", "cost_request", "cost_section", "render", "write_plot"]

MAX_TOKENS = 10**17
"""Most tokens a plan prices: thousands of times what the largest open models were trained on."""

MAX_STEPS = 10**12

_COUNT_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
_OVERRIDES = ("mfu", "price_per_gpu_hour", "intra_node_gbps", "inter_node_gbps", "pcie_gbps")
_PLOT_SUFFIXES = (".png", ".svg", ".pdf")
_PARTS = ("parameters", "gradients", "optimizer_state", "activations", "temporary", "overhead")


def parse_tokens(text: str) -> int:
    """A token count from ``1e10``, ``10B``, ``2T``, ``300M`` or ``10000000000``.

    Raises:
        argparse.ArgumentTypeError: For anything else: below 1, ``inf``/``1e400``, or more
            than :data:`MAX_TOKENS`.

    Example:
        >>> parse_tokens("1e10"), parse_tokens("2T"), parse_tokens("300M")
        (10000000000, 2000000000000, 300000000)
    """
    value = parse_number(text, _COUNT_SUFFIX)
    if value is None or not 1 <= value <= MAX_TOKENS:
        raise argparse.ArgumentTypeError(
            f"expected a positive token count up to 1e17, such as 1e10, 10B or 2T, got {text!r}"
        )
    return value


def add_arguments(plan: argparse.ArgumentParser) -> None:
    """Add the time-and-cost flags to ``plan``'s parser."""
    group = plan.add_argument_group(
        "time and cost",
        "step time, tokens/s, hours and dollars per strategy: compute at an MFU plus the "
        "communication each strategy adds, minus what overlaps (bandwidths in GB/s per GPU "
        "per direction; 400Gb/s is read as 50)",
    )
    group.add_argument(
        "--gpu-type", choices=tuple(GPU_TYPES), help="a GPU from the table (its peak, links, price)"
    )
    group.add_argument(
        "--hardware",
        metavar="FILE",
        help="YAML/JSON of GPU figures: gpu_type: h100 plus fields to change, or all of "
        "name, bf16_tflops, memory_gib, intra_node_gbps, inter_node_gbps, pcie_gbps",
    )
    amount = group.add_mutually_exclusive_group()
    amount.add_argument(
        "--tokens", type=parse_tokens, metavar="N", help="tokens to train: 1e10, 10B, 2T"
    )
    amount.add_argument(
        "--steps", type=bounded_int(1, MAX_STEPS), metavar="N", help="optimizer steps to train"
    )
    group.add_argument(
        "--mfu", type=parse_margin, metavar="F", help="model FLOPs utilisation (default 0.4)"
    )
    group.add_argument(
        "--price-per-gpu-hour",
        type=bounded_float(1e4, "a price in dollars"),
        metavar="USD",
        help="dollars per GPU-hour (default: the guide's price for the GPU type)",
    )
    for flag, where in (
        ("--intra-node-gbps", "to the GPUs of its node (NVLink, PCIe)"),
        ("--inter-node-gbps", "to other nodes (its NIC)"),
        ("--pcie-gbps", "to host memory (CPU offload)"),
    ):
        group.add_argument(flag, type=parse_bandwidth, metavar="GBPS", help=f"per GPU {where}")
    group.add_argument(
        "--plot", metavar="FILE", help="draw memory and time per strategy (.png, .svg, .pdf)"
    )


@dataclass(frozen=True)
class CostRequest:
    """What the user asked to price, checked before anything is measured."""

    spec: GPUSpec
    gpu_type: str | None
    tokens: int | None
    steps: int | None


def cost_request(args: argparse.Namespace) -> CostRequest | None:
    """The hardware and amount to price from ``args`` (None when none was asked for).

    Raises:
        UsageError: For hardware flags without a GPU (``--gpu-type``/``--hardware``), a bad
            hardware file, or a ``--plot`` path that cannot be written.
    """
    from gpu_training.cli import UsageError
    from gpu_training.hardware import HardwareError, gpu_spec, load_hardware

    if args.plot is not None:
        _check_plot_path(args.plot)
    overrides = {name: getattr(args, name) for name in _OVERRIDES}
    given = [f"--{name.replace('_', '-')}" for name, v in overrides.items() if v is not None]
    given += [f for f, v in (("--tokens", args.tokens), ("--steps", args.steps)) if v is not None]
    if args.gpu_type is None and args.hardware is None:
        if given:
            raise UsageError(
                f"plan: {given[0]} needs the hardware: --gpu-type ({', '.join(GPU_TYPES)}) "
                "or --hardware FILE"
            )
        return None
    try:
        if args.hardware is not None:
            spec = load_hardware(args.hardware, args.gpu_type)
        else:
            spec = gpu_spec(args.gpu_type)
        spec = spec.replace(**overrides)
    except HardwareError as err:
        flag = "--hardware" if args.hardware is not None else "--gpu-type"
        raise UsageError(f"plan: {flag}: {err}") from None
    return CostRequest(spec, args.gpu_type, args.tokens, args.steps)


def _check_plot_path(text: str) -> None:
    from gpu_training.cli import UsageError

    path = Path(text)
    if path.suffix.lower() not in _PLOT_SUFFIXES:
        raise UsageError(f"plan: --plot: expected a .png, .svg or .pdf file, got {text!r}")
    if path.is_dir():
        raise UsageError(f"plan: --plot: {text!r} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"plan: --plot: no such directory {str(parent)!r}")


def cost_section(
    request: CostRequest,
    *,
    num_params: int,
    trainable_params: int,
    flops_per_token: float | None,
    flops_source: str,
    tokens_per_sample: int | None,
    micro_batch: int,
    accumulation: int,
    gpus: int,
    gpus_per_node: int | None,
    precision: str,
    activation_checkpointing: bool,
    fits: Mapping[str, bool],
    gpu_memory: int,
    two_d: TrainingRun | None = None,
    two_d_fits: bool = False,
) -> dict[str, Any]:
    """The time-and-cost part of the plan's JSON: one entry per strategy in ``fits``, and
    one for the 2-D layout ``two_d`` (FSDP + tensor parallel, at its own batch) when given.

    Raises:
        UsageError: ``--tokens`` for a model whose task says nothing of tokens per sample.
    """
    from gpu_training.cli import UsageError
    from gpu_training.cost import (
        TrainingRun,
        assumptions,
        peak_flops,
        run_cost,
        step_time,
        tensor_parallel_assumption,
    )

    spec = request.spec
    notes = []
    if flops_per_token is None:
        # Without the task's own figure: every weight is one multiply-add per token, x3.
        flops_per_token, flops_source = 6.0 * num_params, "6N (the task gives no flops_per_token)"
    if tokens_per_sample is None:
        if request.tokens is not None:
            raise UsageError(
                "plan: --tokens: the task does not say how many tokens a sample holds "
                "(Task.tokens_per_sample): give --steps"
            )
        tokens_per_sample = 1  # then "tokens" are samples
        notes.append("the task gives no tokens_per_sample: a sample counts as one token")
    if gpu_memory > spec.memory_gib * 2**30:
        notes.append(f"--gpu-memory is more than one {spec.name} holds ({spec.memory_gib:g} GiB)")
    if spec.price_per_gpu_hour is None:
        notes.append(f"no price for {spec.name}: give --price-per-gpu-hour for the cost")
    run = TrainingRun(
        num_params=num_params,
        trainable_params=trainable_params,
        flops_per_token=flops_per_token,
        tokens_per_sample=tokens_per_sample,
        micro_batch=micro_batch,
        accumulation=accumulation,
        num_gpus=gpus,
        gpus_per_node=gpus_per_node or 0,
        precision=precision,
        activation_checkpointing=activation_checkpointing,
    )
    priced = request.tokens is not None or request.steps is not None
    steps = [(step_time(run, spec, name), fit) for name, fit in fits.items()]
    if two_d is not None:
        steps.append((step_time(two_d, spec, "fsdp"), two_d_fits))
    strategies: dict[str, Any] = {}
    for step, fit in steps:
        row: dict[str, Any] = {
            "compute_s": step.compute_s,
            "communication_s": step.communication_s,
            "exposed_s": step.exposed_s,
            "step_s": step.step_s,
            "tokens_per_s": step.tokens_per_s,
            "mfu": step.mfu(run.flops_per_token, peak_flops(spec, run.precision) / 1e12),
            "fits": fit,
        }
        if priced:
            total = run_cost(
                step,
                tokens=request.tokens,
                steps=request.steps,
                price_per_gpu_hour=spec.price_per_gpu_hour,
            )
            row.update(
                steps=total.steps,
                tokens=total.tokens,
                hours=total.hours,
                gpu_hours=total.gpu_hours,
                dollars=total.dollars,
            )
        strategies[step.strategy] = row
    if two_d is not None and two_d.tokens_per_step != run.tokens_per_step:
        notes.append(f"{steps[-1][0].strategy}: {two_d.tokens_per_step:,} tokens per step")
    lines = assumptions(run, spec)
    if two_d is not None:
        lines.append(tensor_parallel_assumption(two_d))
    return {
        "gpu_type": request.gpu_type,
        "hardware": spec.to_dict(),
        "mfu": spec.mfu,
        "mfu_source": MFU_SOURCE,
        "flops_per_token": run.flops_per_token,
        "flops_per_token_source": flops_source,
        "tokens_per_sample": run.tokens_per_sample,
        "tokens_per_step": run.tokens_per_step,
        "gpus": gpus,
        "gpus_per_node": run.per_node,
        "nodes": run.nodes,
        "tokens": request.tokens,
        "steps": request.steps,
        "strategies": strategies,
        "assumptions": lines,
        "notes": notes,
    }


def _seconds(value: float) -> str:
    if value == 0:
        return "0"
    if value < 1e-3:
        return f"{value * 1e6:.3g}us"
    if value < 1:
        return f"{value * 1e3:.3g}ms"
    return f"{value:.3g}s"


def _count(n: float) -> str:
    for scale, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}"


def _quantity(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _dollars(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"${value:,.0f}" if value >= 100 else f"${value:.2f}"


def render(section: Mapping[str, Any]) -> list[str]:
    """The time-and-cost table, its assumptions and notes, as lines of text."""
    hw = section["hardware"]
    priced = section["tokens"] is not None or section["steps"] is not None
    rows = section["strategies"]
    first = next(iter(rows.values()))
    where = (
        f"{section['gpus']} x {hw['name']} ({section['nodes']} node"
        f"{'s' if section['nodes'] > 1 else ''} of {section['gpus_per_node']}), "
        f"MFU {section['mfu']:.0%}"
    )
    if priced:
        price = hw["price_per_gpu_hour"]
        where += f", ${price:.2f}/GPU-hour" if price is not None else ", no price"
        per_step = f"{section['tokens_per_step']:,} tokens"
        amount = (
            f"{_count(section['tokens'])} tokens ({first['steps']:,} steps of {per_step})"
            if section["tokens"] is not None
            else f"{first['steps']:,} steps of {per_step} ({_count(first['tokens'])} tokens)"
        )
        title = f"time and cost of {amount}, on {where}:"
    else:
        title = (
            f"time per step of {section['tokens_per_step']:,} tokens, on {where} "
            "(--tokens or --steps for hours and cost):"
        )
    head = f"{'strategy':<15}{'compute':>9}{'comm':>9}{'exposed':>9}{'step':>9}{'tokens/s':>12}{'MFU':>5}"
    if priced:
        head += f"{'hours':>10}{'GPU-hours':>11}{'cost':>11}"
    lines = [title, head + "  fits"]
    for name, row in rows.items():
        line = (
            f"{name:<15}{_seconds(row['compute_s']):>9}{_seconds(row['communication_s']):>9}"
            f"{_seconds(row['exposed_s']):>9}{_seconds(row['step_s']):>9}"
            f"{_quantity(row['tokens_per_s']):>12}{row['mfu']:>5.0%}"
        )
        if priced:
            line += f"{_quantity(row['hours']):>10}{_quantity(row['gpu_hours']):>11}"
            line += f"{_dollars(row['dollars']):>11}"
        lines.append(f"{line}  {'yes' if row['fits'] else 'NO'}")
    fitting = [(row["step_s"], name) for name, row in rows.items() if row["fits"]]
    if fitting:
        best = rows[min(fitting)[1]]
        summary = (
            f"fastest that fits: {min(fitting)[1]}, {_quantity(best['tokens_per_s'])} tokens/s"
        )
        if priced:
            summary += f", {_quantity(best['hours'])} hours, {_dollars(best['dollars'])}"
        lines.append(summary)
    lines.append("assumptions:")
    lines += [f"  {text}" for text in section["assumptions"]]
    if section["mfu"] == DEFAULT_MFU:
        lines.append(f"  MFU {DEFAULT_MFU:.0%} (the default; --mfu to change): {MFU_SOURCE}")
    else:
        lines.append(
            f"  MFU {section['mfu']:.0%} as given; the default {DEFAULT_MFU:.0%} is {MFU_SOURCE}"
        )
    lines.append(f"  FLOPs per token: {section['flops_per_token_source']}")
    lines.append(f"  hardware: {hw['source']}")
    lines += [f"note: {text}" for text in section["notes"]]
    return lines


def write_plot(path: str, result: Mapping[str, Any]) -> str | None:
    """Draw memory per GPU (and, with hardware, time) per strategy to ``path``.

    Returns:
        ``path``, or None (after one line on stderr) when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: render to a file
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            f"plan: --plot: matplotlib is not installed (pip install 'gpu-training[plot]'); "
            f"{path} not written",
            file=sys.stderr,
        )
        return None
    candidates = result["candidates"]
    names = list(candidates)
    section = result.get("time")
    fig, axes = plt.subplots(1, 2 if section else 1, figsize=(12 if section else 6.5, 4.5))
    memory_ax = axes[0] if section else axes
    bottom = [0.0] * len(names)
    for part in _PARTS:
        heights = [candidates[n][part] / 2**30 for n in names]
        memory_ax.bar(names, heights, bottom=bottom, label=part.replace("_", " "))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    # The parts can add up to more than the step's peak (activations go as gradients come).
    totals = [candidates[n]["total"] / 2**30 for n in names]
    memory_ax.scatter(names, totals, marker="_", s=800, color="black", label="peak (total)")
    memory_ax.axhline(result["gpu_memory_bytes"] / 2**30, color="black", linestyle="--")
    memory_ax.set_ylabel("GiB per GPU")
    memory_ax.set_title(f"memory at per-device batch {result['micro_batch']} (dashed: the GPU)")
    memory_ax.legend(fontsize="small")
    if section:
        rows = section["strategies"]
        priced = section["tokens"] is not None or section["steps"] is not None
        scale, unit = (1 / 3600, "hours to the end") if priced else (1.0, "seconds per step")
        steps = [rows[n].get("steps", 1) for n in names]
        compute = [rows[n]["compute_s"] * s * scale for n, s in zip(names, steps, strict=True)]
        exposed = [rows[n]["exposed_s"] * s * scale for n, s in zip(names, steps, strict=True)]
        axes[1].bar(names, compute, label="compute")
        axes[1].bar(names, exposed, bottom=compute, label="exposed communication")
        axes[1].set_ylabel(unit)
        axes[1].set_title(f"time on {section['gpus']} x {section['hardware']['name']}")
        axes[1].legend(fontsize="small")
    for ax in axes if section else (axes,):
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    out = Path(path)
    tmp = out.with_name(f".{out.name}.tmp{out.suffix}")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, out)  # a reader never sees half a file
    return path
