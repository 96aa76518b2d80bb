"""``gpu-training plan``: know what fits before you run.

``plan`` measures a model (a built-in task, an import string, a job file) or a transformer
shape (``--params 7e9 --layers 32 --hidden 4096 --seq 4096``) on fake tensors, lays its memory
out per GPU for every strategy, applies the guide's decision tree, and prints the strategy,
the per-device batch and accumulation for the global batch, the scaled learning rate and the
launch command (``--json`` for machines)::

    $ gpu-training plan --params 7e9 --layers 32 --hidden 4096 --seq 4096 --vocab 32000 \\
          --arch llama --gpu-memory 80 --gpus 8 --global-batch 512

Its sibling ``gpu-training find-batch`` (:mod:`gpu_training.commands.find_batch`) finds the
largest batch by running real steps instead of estimating.

torch is imported inside the run functions only, so ``gpu-training --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# parse_size is public here too: users and tests import it from this module.
from gpu_training.commands._sizing_inputs import (
    batch_factory,
    parse_margin,
    parse_positive_float,
    parse_size,
)

if TYPE_CHECKING:
    from gpu_training.job import JobConfig
    from gpu_training.memory import MemoryEstimate, MemoryProfile
    from gpu_training.strategy import StrategyChoice

__all__ = ["parse_count", "parse_size", "register"]

_COUNT_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
_JOB_SUFFIXES = (".yaml", ".yml", ".json")
_PARTS = ("parameters", "gradients", "optimizer_state", "activations", "temporary")
_LAUNCH_STRATEGY: dict[str, dict[str, Any]] = {
    "ddp": {"name": "ddp"},
    "none": {"name": "none"},
    "fsdp": {"name": "fsdp"},
    "zero3_offload": {"name": "deepspeed", "zero_stage": 3, "offload": "optimizer"},
}


def parse_count(text: str) -> int:
    """A parameter count from ``7e9``, ``7B``, ``124M``, ``1.5b`` or ``124000000``.

    Raises:
        argparse.ArgumentTypeError: For anything else, or a count below 1.

    Example:
        >>> parse_count("7e9"), parse_count("124M"), parse_count("1.5B")
        (7000000000, 124000000, 1500000000)
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbtKMBT]?)\s*", text)
    value = round(float(match.group(1)) * _COUNT_SUFFIX[match.group(2).lower()]) if match else 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive count such as 7e9, 7B or 124M, got {text!r}"
        )
    return value


# --- parsers ---------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    """Add ``plan`` to the ``gpu-training`` parser."""
    from gpu_training.cli import _positive_int

    plan = subparsers.add_parser(
        "plan",
        help="what fits in GPU memory, which strategy, batch, LR and launch command",
        description=(
            "Measure a model's memory (activations on fake tensors: no GPU, no compute), lay "
            "it out per GPU for DDP, ZeRO-1/2, FSDP and ZeRO-3 + CPU offload, and recommend a "
            "strategy (the guide's decision tree), a per-device batch and accumulation for the "
            "global batch, the scaled learning rate and the launch command."
        ),
    )
    plan.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="a built-in task (charlm), an import string 'pkg.mod:make_task' returning a "
        "Task (or, with --data, a model factory), or a job file (.yaml/.json); omit it and "
        "give --params/--layers/--hidden for a transformer shape",
    )
    plan.add_argument("--data", metavar="SPEC", help="data factory import string for MODEL")
    plan.add_argument(
        "--task-option",
        dest="task_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the task / model factory (repeatable), e.g. n_layer=8",
    )
    shape = plan.add_argument_group("transformer shape (instead of MODEL)")
    shape.add_argument("--params", type=parse_count, metavar="N", help="parameters: 7e9, 124M")
    shape.add_argument("--layers", type=_positive_int, metavar="L")
    shape.add_argument("--hidden", type=_positive_int, metavar="H", help="hidden size")
    shape.add_argument("--heads", type=_positive_int, metavar="A", help="default hidden / 64")
    shape.add_argument("--kv-heads", type=_positive_int, metavar="K", help="grouped-query KV heads")
    shape.add_argument("--seq", type=_positive_int, metavar="T", help="sequence length (2048)")
    shape.add_argument("--vocab", type=_positive_int, metavar="V", help="vocabulary (50257)")
    shape.add_argument("--ffn", type=_positive_int, metavar="F", help="MLP width")
    shape.add_argument("--arch", choices=("gpt", "llama"), default="gpt")
    hw = plan.add_argument_group("hardware and training")
    hw.add_argument(
        "--gpu-memory", type=parse_size, required=True, metavar="SIZE", help="per GPU: 80, 80GB"
    )
    hw.add_argument("--gpus", type=_positive_int, default=1, metavar="N", help="GPUs in all")
    hw.add_argument("--gpus-per-node", type=_positive_int, metavar="N", help="default min(N, 8)")
    hw.add_argument("--global-batch", type=_positive_int, metavar="G", help="samples per step")
    hw.add_argument("--micro-batch", type=_positive_int, metavar="B", help="per-device batch")
    hw.add_argument("--precision", choices=("auto", "bf16", "fp16", "fp32"))
    hw.add_argument("--optimizer", choices=("adamw", "adam", "sgd", "sgd_momentum"))
    hw.add_argument("--activation-checkpointing", choices=("auto", "on", "off"), default="auto")
    hw.add_argument("--lr", type=parse_positive_float, metavar="LR", help="learning rate as tuned")
    hw.add_argument("--base-batch", type=_positive_int, metavar="N", help="batch it was tuned at")
    hw.add_argument("--lr-scaling", choices=("linear", "sqrt", "none"))
    hw.add_argument("--safety-margin", type=parse_margin, default=0.85, metavar="F")
    hw.add_argument(
        "--overhead",
        type=parse_size,
        default=500 * 2**20,
        metavar="SIZE",
        help="per GPU: CUDA context and slack (500MiB)",
    )
    hw.add_argument("--script", default="train.py", help="training script for the command")
    plan.add_argument("--json", action="store_true", help="print one JSON document")
    plan.set_defaults(_run=_run_plan)


# --- what to plan for ------------------------------------------------------------------------


@dataclass
class _Subject:
    """The measured model and what the plan needs to know about it."""

    profile: MemoryProfile
    description: str
    precision: str
    optimizer: str
    job: JobConfig | None = None
    job_path: str | None = None


def _options(pairs: Sequence[str]) -> dict[str, Any]:
    from gpu_training.cli import UsageError
    from gpu_training.config import ConfigError, parse_override

    try:
        return dict(parse_override(text) for text in pairs)
    except ConfigError as err:
        raise UsageError(f"--task-option: {err}") from None


def _subject(args: argparse.Namespace) -> _Subject:
    from gpu_training.cli import UsageError
    from gpu_training.memory import MemoryBudgetError, TransformerShape, profile_memory

    shape_flags = [f for f in ("layers", "hidden") if getattr(args, f) is not None]
    optimizer = args.optimizer or "adamw"
    if args.model is None:
        if len(shape_flags) < 2:
            raise UsageError(
                "plan: give MODEL (a task, an import string or a job file) or a transformer shape: "
                "--layers and --hidden (with --params, --seq, --vocab as known)"
            )
        precision = args.precision or "bf16"
        try:
            shape = TransformerShape(
                num_layers=args.layers,
                hidden_size=args.hidden,
                seq_len=args.seq or 2048,
                num_heads=args.heads,
                vocab_size=args.vocab or (32000 if args.arch == "llama" else 50257),
                ffn_hidden_size=args.ffn,
                num_kv_heads=args.kv_heads,
                arch=args.arch,
            )
            profile = profile_memory(
                shape=shape,
                num_params=args.params,
                precision=precision,
                optimizer=optimizer,
                device="cuda",
            )
        except MemoryBudgetError as err:
            raise UsageError(f"plan: {err}") from None
        described = (
            f"{shape.arch} transformer, {shape.num_layers} layers x {shape.hidden_size} hidden, "
            f"{shape.heads} heads, seq {shape.seq_len}, vocab {shape.vocab_size}"
        )
        return _Subject(profile, described, precision, optimizer)
    if shape_flags or args.params is not None:
        raise UsageError(
            "plan: give either MODEL or a shape (--params/--layers/--hidden), not both"
        )
    import torch

    from gpu_training.tasks import resolve_task, task_from_imports

    job = None
    if Path(args.model).suffix.lower() in _JOB_SUFFIXES:
        from gpu_training.job import load_job
        from gpu_training.trainer import build_task

        job = load_job(args.model)
        task = build_task(job)
    elif args.data is not None:
        task = task_from_imports(args.model, args.data, model_kwargs=_options(args.task_options))
    else:
        task = resolve_task(args.model, _options(args.task_options))
    precision = args.precision or (
        job.training.precision if job is not None and job.training.precision != "auto" else "bf16"
    )
    with torch.device("meta"):  # structure only: a 70B model costs nothing here
        model = task.build_model()
    train_set, _ = task.build_data()
    try:
        profile = profile_memory(
            model,
            make_batch=batch_factory(train_set, "plan"),
            loss_fn=task.loss_fn,
            precision=precision,
            optimizer=optimizer,
            device="cuda",
        )
    except MemoryBudgetError as err:
        raise UsageError(f"plan: {err}") from None
    described = task.describe or task.name
    return _Subject(profile, described, precision, optimizer, job, args.model)


# --- the plan --------------------------------------------------------------------------------

_RANK = {"none": 0, "ddp": 0, "fsdp": 1}


def _rank(choice: StrategyChoice) -> int:
    if not choice.fits:
        return 3
    return _RANK.get(choice.strategy, 2)


def _layout(choice: StrategyChoice) -> str:
    if choice.strategy in ("none", "ddp", "fsdp"):
        return "ddp" if choice.strategy == "none" else choice.strategy
    return "zero3_offload"


def _choose(
    subject: _Subject, args: argparse.Namespace, batch: int, checkpointing: bool
) -> StrategyChoice:
    from gpu_training.memory import ModelStateBytes
    from gpu_training.strategy import CANDIDATES, choose_strategy

    p = subject.profile
    n = args.gpus

    def estimate(strategy: str, gpus: int) -> MemoryEstimate:
        return p.estimate(
            batch,
            strategy=strategy,
            world_size=gpus,
            activation_checkpointing=checkpointing,
            overhead_bytes=args.overhead,
        )

    return choose_strategy(
        p.num_params,
        gpu_memory_bytes=args.gpu_memory,
        num_gpus=n,
        activation_bytes=p.activation_bytes(batch, checkpointing),
        overhead_bytes=args.overhead,
        state_bytes=ModelStateBytes(p.parameter_bytes, p.gradient_bytes, p.optimizer_bytes),
        candidate_bytes={c: estimate(c, n).allocated for c in CANDIDATES},
        fsdp_bytes=lambda k: estimate("fsdp", k).allocated,
    )


@dataclass
class _Batch:
    micro: int
    accumulation: int
    global_batch: int
    largest_fitting: int | None
    note: str


def _plan_batch(
    subject: _Subject, args: argparse.Namespace, layout: str, checkpointing: bool
) -> _Batch:
    from gpu_training.cli import UsageError
    from gpu_training.config import global_batch_split_message
    from gpu_training.profiling import BatchSizeError, search_max_batch_size

    n = args.gpus
    global_batch = args.global_batch
    if global_batch is None and subject.job is not None:
        global_batch = subject.job.training.global_batch_size
    if global_batch is not None and global_batch % n:
        raise UsageError(
            f"plan: --global-batch {global_batch} is not a multiple of --gpus {n}: "
            f"{global_batch_split_message(global_batch, 1, n)}"
        )
    per_rank = global_batch // n if global_batch is not None else None

    def fits(batch: int) -> bool:
        est = subject.profile.estimate(
            batch,
            strategy=layout,
            world_size=n,
            activation_checkpointing=checkpointing,
            overhead_bytes=args.overhead,
        )
        return est.total <= args.gpu_memory

    ceiling = per_rank if per_rank is not None else max(args.micro_batch or 1, 4096)
    try:
        found = search_max_batch_size(fits, 1, ceiling, args.safety_margin)
    except BatchSizeError:
        found = None
    if args.micro_batch is not None:
        micro = args.micro_batch
        if per_rank is not None and per_rank % micro:
            raise UsageError(
                f"plan: --micro-batch {micro} does not divide the per-GPU share {per_rank} of "
                f"--global-batch {global_batch}: {global_batch_split_message(global_batch, micro, n)}"
            )
        note = "per-device batch as given"
        if found is None or micro > found.best_fitting:
            note += " (does NOT fit by the estimate)"
    elif found is None:
        micro, note = 1, "even a per-device batch of 1 does not fit by the estimate"
    else:
        limit = found.recommended
        micro = (
            limit if per_rank is None else max(d for d in range(1, limit + 1) if per_rank % d == 0)
        )
        if found.hit_max_batch and per_rank is not None:
            note = f"the whole per-GPU share of {per_rank} fits"
        else:
            note = f"largest per-device batch that fits: {found.best_fitting}"
            note += " (the search ceiling)" if found.hit_max_batch else ""
        note += f"; {args.safety_margin:g} margin -> {found.recommended}"
        if micro != found.recommended:
            note += f"; {micro} divides the per-GPU share {per_rank}"
    if per_rank is None:
        return _Batch(micro, 1, micro * n, found.best_fitting if found else None, note)
    return _Batch(
        micro, per_rank // micro, global_batch, found.best_fitting if found else None, note
    )


def _learning_rate(
    subject: _Subject, args: argparse.Namespace, global_batch: int
) -> dict[str, Any] | None:
    from gpu_training.config import scale_lr

    training = subject.job.training if subject.job is not None else None
    lr = args.lr if args.lr is not None else (training.learning_rate if training else None)
    if lr is None:
        return None
    base = args.base_batch or (training.base_batch_size if training else None) or global_batch
    rule = args.lr_scaling or (training.lr_scaling if training else "linear")
    return {
        "base_lr": lr,
        "base_batch": base,
        "rule": rule,
        "global_batch": global_batch,
        "lr": scale_lr(lr, base, global_batch, rule),
    }


def _launch(
    subject: _Subject,
    args: argparse.Namespace,
    layout: str,
    checkpointing: bool,
    batch: _Batch,
) -> tuple[dict[str, Any], list[str]]:
    from gpu_training.launcher import multi_node_commands, single_node_command

    strategy = dict(_LAUNCH_STRATEGY[layout])
    if checkpointing:
        strategy["activation_checkpointing"] = True
    per_node = args.gpus_per_node or min(args.gpus, 8)
    nnodes = math.ceil(args.gpus / per_node)
    if subject.job_path is not None and nnodes == 1:
        sets = [
            f"strategy.{k}={str(v).lower() if isinstance(v, bool) else v}"
            for k, v in strategy.items()
        ]
        sets += [
            f"training.per_device_batch_size={batch.micro}",
            f"training.global_batch_size={batch.global_batch}",
        ]
        command = f"gpu-training train {subject.job_path} --nproc {per_node} " + " ".join(
            f"--set {s}" for s in sets
        )
        return strategy, [command]
    if nnodes == 1:
        return strategy, [single_node_command(args.script, per_node)]
    return strategy, multi_node_commands(
        args.script, nnodes=nnodes, nproc_per_node=per_node, rdzv_endpoint="HEAD_NODE:29500"
    )


def _run_plan(args: argparse.Namespace) -> int:
    from gpu_training.cli import UsageError
    from gpu_training.memory import format_bytes
    from gpu_training.strategy import CANDIDATES

    if args.gpus_per_node is not None and args.gpus % args.gpus_per_node:
        raise UsageError(
            f"plan: --gpus {args.gpus} is not a multiple of --gpus-per-node {args.gpus_per_node}"
        )
    if args.overhead >= args.gpu_memory:
        raise UsageError(
            f"plan: --overhead ({format_bytes(args.overhead)}) must be below --gpu-memory "
            f"({format_bytes(args.gpu_memory)})"
        )
    subject = _subject(args)
    p = subject.profile
    probe = args.micro_batch or 1
    modes = {"auto": (False, True), "on": (True,), "off": (False,)}[args.activation_checkpointing]
    if p.checkpoint_samples is None:
        if args.activation_checkpointing == "on":
            raise UsageError(
                "plan: --activation-checkpointing on: the model has no repeated blocks"
            )
        modes = (False,)
    # The guide's tree asks "fits on 1 GPU?" after checkpointing too: the least sharding wins,
    # and without checkpointing when that is as good.
    choices = [(_choose(subject, args, probe, ckpt), ckpt) for ckpt in modes]
    choice, checkpointing = min(choices, key=lambda c: (_rank(c[0]), c[1]))
    layout = _layout(choice)
    batch = _plan_batch(subject, args, layout, checkpointing)
    table = {
        c: p.estimate(
            batch.micro,
            strategy=c,
            world_size=args.gpus,
            activation_checkpointing=checkpointing,
            overhead_bytes=args.overhead,
        )
        for c in CANDIDATES
    }
    lr = _learning_rate(subject, args, batch.global_batch)
    strategy, commands = _launch(subject, args, layout, checkpointing, batch)
    result = {
        "model": subject.description,
        "num_params": p.num_params,
        "precision": subject.precision,
        "optimizer": subject.optimizer,
        "method": p.method,
        "notes": list(p.notes),
        "gpus": args.gpus,
        "gpu_memory_bytes": args.gpu_memory,
        "overhead_bytes": args.overhead,
        "activation_checkpointing": checkpointing,
        "micro_batch": batch.micro,
        "decision_batch": probe,
        "candidates": {
            c: {**e.breakdown(), "fits": e.fits(args.gpu_memory)} for c, e in table.items()
        },
        "recommended": {
            "strategy": choice.strategy,
            "zero_stage": choice.zero_stage,
            "offload": choice.offload,
            "layout": layout,
            "fits": choice.fits,
            "min_gpus_full_sharding": choice.min_gpus,
            "reason": choice.reason,
            "strategy_config": strategy,
        },
        "batch": {
            "per_device": batch.micro,
            "gradient_accumulation_steps": batch.accumulation,
            "global": batch.global_batch,
            "largest_fitting": batch.largest_fitting,
            "note": batch.note,
        },
        "learning_rate": lr,
        "launch": commands,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(_render(result, args))
    return 0


def _count(n: int) -> str:
    for scale, unit in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _render(r: dict[str, Any], args: argparse.Namespace) -> str:
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
    name = {"none": "single GPU", "ddp": "DDP", "fsdp": "FSDP"}.get(rec["strategy"])
    if name is None:
        name = f"DeepSpeed ZeRO-{rec['zero_stage']} + CPU offload of the {rec['offload']}"
    extra = " + activation checkpointing" if r["activation_checkpointing"] else ""
    fits = "" if rec["fits"] else "  (does NOT fit)"
    lines += [
        "",
        f"recommended: {name}{extra}{fits}",
        f"  decided at per-device batch {r['decision_batch']}: {rec['reason']}",
    ]
    b = r["batch"]
    lines.append(
        f"batch: per-device {b['per_device']} x accumulation {b['gradient_accumulation_steps']} "
        f"x {r['gpus']} GPUs = global {b['global']} ({b['note']})"
    )
    lr = r["learning_rate"]
    if lr is not None:
        lines.append(
            f"learning rate: {lr['lr']:.4g} ({lr['rule']} scaling of {lr['base_lr']:g} from "
            f"batch {lr['base_batch']} to {lr['global_batch']})"
        )
    lines.append("launch:")
    lines += [f"  {c}" for c in r["launch"]]
    config = ", ".join(
        f"{k}: {str(v).lower() if isinstance(v, bool) else v}"
        for k, v in rec["strategy_config"].items()
    )
    lines.append(f"  job file: strategy: {{{config}}}")
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)
