"""``gpu-training plan``: know what fits before you run.

``plan`` measures a model (a built-in task, an import string, a job file) or a transformer
shape (``--params 7e9 --layers 32 --hidden 4096 --seq 4096``) on fake tensors, lays its memory
out per GPU for every strategy, applies the guide's decision tree, and prints the strategy,
the per-device batch and accumulation for the global batch, the scaled learning rate and the
launch command (``--json`` for machines)::

    $ gpu-training plan --params 7e9 --layers 32 --hidden 4096 --seq 4096 --vocab 32000 \\
          --arch llama --gpu-memory 80 --gpus 8 --global-batch 512

With the hardware and the amount to train (``--gpu-type h100 --tokens 1e10``) it also prints
the step time, tokens/s, hours and dollars of every strategy beside the memory table
(:mod:`gpu_training.commands._plan_cost`, the model in :mod:`gpu_training.cost`).

Its sibling ``gpu-training find-batch`` (:mod:`gpu_training.commands.find_batch`) finds the
largest batch by running real steps instead of estimating.

torch is imported inside the run functions only, so ``gpu-training --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_training.commands import _plan_cost

# parse_size is public here too: users and tests import it from this module.
from gpu_training.commands._sizing_inputs import (
    MAX_BATCH,
    MAX_DIMENSION,
    MAX_GPUS,
    batch_factory,
    bounded_int,
    parse_margin,
    parse_number,
    parse_positive_float,
    parse_size,
)

if TYPE_CHECKING:
    from gpu_training.job import JobConfig
    from gpu_training.memory import MemoryEstimate, MemoryProfile
    from gpu_training.strategy import StrategyChoice

__all__ = ["parse_count", "parse_size", "register"]

_COUNT_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
_MAX_PARAMS = 10**15  # a thousand times today's largest models: beyond is a typo
_JOB_FILE = "job.yaml"  # what the launch command of a task (not a job file) runs
_HEAD = "HEAD_NODE:29500"
_TRAINING_FLAGS = {  # plan flags that the printed job carries as training fields
    "precision": "precision",
    "lr": "learning_rate",
    "base_batch": "base_batch_size",
    "lr_scaling": "lr_scaling",
}
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
        argparse.ArgumentTypeError: For anything else: a count below 1, ``inf``/``1e400``,
            or more than 10¹⁵.

    Example:
        >>> parse_count("7e9"), parse_count("124M"), parse_count("1.5B")
        (7000000000, 124000000, 1500000000)
    """
    value = parse_number(text, _COUNT_SUFFIX)
    if value is None or not 1 <= value <= _MAX_PARAMS:
        raise argparse.ArgumentTypeError(
            f"expected a positive count up to 1e15, such as 7e9, 7B or 124M, got {text!r}"
        )
    return value


# --- parsers ---------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    """Add ``plan`` to the ``gpu-training`` parser."""
    dimension = bounded_int(1, MAX_DIMENSION)
    gpus = bounded_int(1, MAX_GPUS)
    batch = bounded_int(1, MAX_BATCH)
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
        "--hf-config",
        metavar="CONFIG",
        help="a Hugging Face config.json (or its directory) instead of MODEL: that "
        "architecture, built on the meta device, at --seq tokens (default its context, <= 1024)",
    )
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
    shape.add_argument("--layers", type=dimension, metavar="L")
    shape.add_argument("--hidden", type=dimension, metavar="H", help="hidden size")
    shape.add_argument("--heads", type=dimension, metavar="A", help="default hidden / 64")
    shape.add_argument("--kv-heads", type=dimension, metavar="K", help="grouped-query KV heads")
    shape.add_argument("--seq", type=dimension, metavar="T", help="sequence length (2048)")
    shape.add_argument("--vocab", type=dimension, metavar="V", help="vocabulary (50257)")
    shape.add_argument("--ffn", type=dimension, metavar="F", help="MLP width")
    shape.add_argument("--arch", choices=("gpt", "llama"), default="gpt")
    hw = plan.add_argument_group("hardware and training")
    hw.add_argument(
        "--gpu-memory", type=parse_size, required=True, metavar="SIZE", help="per GPU: 80, 80GB"
    )
    hw.add_argument("--gpus", type=gpus, default=1, metavar="N", help="GPUs in all")
    hw.add_argument("--gpus-per-node", type=gpus, metavar="N", help="default min(N, 8)")
    hw.add_argument("--global-batch", type=batch, metavar="G", help="samples per step")
    hw.add_argument("--micro-batch", type=batch, metavar="B", help="per-device batch")
    hw.add_argument("--precision", choices=("auto", "bf16", "fp16", "fp32"))
    hw.add_argument("--optimizer", choices=("adamw", "adam", "sgd", "sgd_momentum"))
    hw.add_argument("--activation-checkpointing", choices=("auto", "on", "off"), default="auto")
    hw.add_argument("--lr", type=parse_positive_float, metavar="LR", help="learning rate as tuned")
    hw.add_argument("--base-batch", type=batch, metavar="N", help="batch it was tuned at")
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
    _plan_cost.add_arguments(plan)
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
    """The job file measured: the launch command runs it, with the plan's ``--set``."""
    job_sections: dict[str, Any] | None = None
    """For a task (not a job file): the ``task`` / ``task_options`` of a job that trains it."""
    flops_per_token: float | None = None
    """Training FLOPs per token, for the time and cost (None: the task gives none)."""
    flops_source: str = ""
    tokens_per_sample: int | None = None


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
    if args.hf_config is not None and (args.model is not None or shape_flags or args.params):
        raise UsageError("plan: give --hf-config, MODEL or a shape (--layers/--hidden), not two")
    if args.model is None and args.hf_config is None:
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
        from gpu_training.cost import shape_flops_per_token

        return _Subject(
            profile,
            described,
            precision,
            optimizer,
            flops_per_token=shape_flops_per_token(shape, profile.num_params),
            flops_source="6N + 12LHQT of the shape (N without the embedding lookups)",
            tokens_per_sample=shape.seq_len,
        )
    if shape_flags or args.params is not None:
        raise UsageError(
            "plan: give either MODEL or a shape (--params/--layers/--hidden), not both"
        )
    import torch

    from gpu_training.tasks import resolve_task, task_from_imports

    job = None
    options = _options(args.task_options)
    sections: dict[str, Any] | None = {"task": args.model}
    if args.hf_config is not None:
        task = _hf_config_task(args.hf_config, args.seq)
        sections = {
            "task": "hf",
            "task_options": {"config": args.hf_config, "block_size": task.tokens_per_sample},
        }
    elif Path(args.model).suffix.lower() in _JOB_SUFFIXES:
        from gpu_training.job import load_job
        from gpu_training.tasks import build_task

        job = load_job(args.model)
        task = build_task(job)
        sections = None
    elif args.data is not None:
        task = task_from_imports(args.model, args.data, model_kwargs=options)
        # A job file cannot hand options to a model factory: then the launch is a script's.
        sections = None if options else {"task": {"model": args.model, "data": args.data}}
    else:
        task = resolve_task(args.model, options)
        if options:
            sections = {"task": args.model, "task_options": options}
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
    job_path = args.model if job is not None else None
    return _Subject(
        profile,
        described,
        precision,
        optimizer,
        job,
        job_path,
        sections,
        flops_per_token=task.flops_per_token,
        flops_source=f"the task's flops_per_token ({task.name})",
        tokens_per_sample=task.tokens_per_sample,
    )


def _hf_config_task(config: str, seq: int | None) -> Any:
    from gpu_training.cli import UsageError
    from gpu_training.config import ConfigError

    try:
        from gpu_training.tasks.hf import plan_task

        return plan_task(config, seq)
    except ConfigError as err:
        message = str(err).replace("field 'task_options.config'", "--hf-config")
        message = message.replace("field 'task_options.block_size'", "--seq")
        raise UsageError(f"plan: {message}") from None
    except ImportError as err:
        raise UsageError(f"plan: --hf-config needs the hf extra ({err})") from None


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
    from gpu_training.batch_finder import (
        BatchSizeError,
        margin_ceiling,
        per_device_batch_for_share,
        search_max_batch_size,
    )
    from gpu_training.cli import UsageError
    from gpu_training.config import global_batch_split_message

    n = args.gpus
    margin = args.safety_margin
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

    # With a global batch, search just far enough to know whether the per-GPU share fits
    # with the margin kept: a larger per-device batch is of no use to this job.
    ceiling = (
        margin_ceiling(per_rank, margin)
        if per_rank is not None
        else max(args.micro_batch or 1, 4096)
    )
    try:
        found = search_max_batch_size(fits, 1, ceiling, margin)
    except BatchSizeError:
        found = None
    largest = found.best_fitting if found else None
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
    elif per_rank is None:
        micro = found.recommended
        note = f"largest per-device batch that fits: {found.best_fitting}"
        note += " (the search ceiling)" if found.hit_max_batch else ""
        note += f"; {margin:g} margin -> {found.recommended}"
    else:
        micro = per_device_batch_for_share(per_rank, found.recommended)
        if micro == per_rank:
            note = f"the whole per-GPU share of {per_rank} fits with the {margin:g} margin"
        else:
            note = (
                f"the per-GPU share of {per_rank} does not fit with the {margin:g} margin: "
                f"largest per-device batch that fits: {found.best_fitting}; {margin:g} margin "
                f"-> {found.recommended}; {micro} divides the share"
            )
    if per_rank is None:
        return _Batch(micro, 1, micro * n, largest, note)
    return _Batch(micro, per_rank // micro, per_rank * n, largest, note)


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


def _setting(value: Any) -> str:
    """A value as ``--set`` and the job file write it (YAML: ``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class _Launch:
    strategy: dict[str, Any]
    """The job file's ``strategy`` section."""
    commands: list[str]
    """Shell command lines: one, or one per node for a script launched with torchrun."""
    job_file: dict[str, Any] | None = None
    """For a task: the content of :data:`_JOB_FILE`, which the command trains."""


def _launch(
    subject: _Subject,
    args: argparse.Namespace,
    layout: str,
    checkpointing: bool,
    batch: _Batch,
) -> _Launch:
    from gpu_training.launcher import multi_node_commands, single_node_command

    strategy = dict(_LAUNCH_STRATEGY[layout])
    if checkpointing:
        strategy["activation_checkpointing"] = True
    per_node = args.gpus_per_node or min(args.gpus, 8)
    nnodes = math.ceil(args.gpus / per_node)
    if subject.job_path is None and subject.job_sections is None:  # a shape: the user's script
        if nnodes == 1:
            return _Launch(strategy, [single_node_command(args.script, per_node)])
        return _Launch(
            strategy,
            multi_node_commands(
                args.script, nnodes=nnodes, nproc_per_node=per_node, rdzv_endpoint=_HEAD
            ),
        )
    training: dict[str, Any] = {
        "per_device_batch_size": batch.micro,
        "global_batch_size": batch.global_batch,
    }
    # What the plan was told that the job would not otherwise know.
    for flag, name in _TRAINING_FLAGS.items():
        if getattr(args, flag) is not None:
            training[name] = getattr(args, flag)
    job_file = None
    if subject.job_path is not None:
        target = subject.job_path
        sets = [f"strategy.{k}={_setting(v)}" for k, v in strategy.items()]
        sets += [f"training.{k}={_setting(v)}" for k, v in training.items()]
    else:
        assert subject.job_sections is not None  # checked above
        target, sets = _JOB_FILE, []
        job_file = {**subject.job_sections, "training": training, "strategy": strategy}
    where = ["--nproc", str(per_node)]
    if nnodes > 1:  # `launch` starts torchrun as one node of the rendezvous; run it on each
        where += ["--nnodes", str(nnodes), "--rdzv-endpoint", _HEAD]
    command = ["gpu-training", "train" if nnodes == 1 else "launch"]
    command += [target, *where] if nnodes == 1 else [*where, target]
    command += [part for text in sets for part in ("--set", text)]
    return _Launch(strategy, [shlex.join(command)], job_file)


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
    cost = _plan_cost.cost_request(args)  # bad hardware input answers before any measuring
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
    launch = _launch(subject, args, layout, checkpointing, batch)
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
            "strategy_config": launch.strategy,
        },
        "batch": {
            "per_device": batch.micro,
            "gradient_accumulation_steps": batch.accumulation,
            "global": batch.global_batch,
            "largest_fitting": batch.largest_fitting,
            "note": batch.note,
        },
        "learning_rate": lr,
        "launch": launch.commands,
        "job_file": launch.job_file,
    }
    result["time"] = None
    if cost is not None:
        result["time"] = _plan_cost.cost_section(
            cost,
            num_params=p.num_params,
            trainable_params=p.trainable_params,
            flops_per_token=subject.flops_per_token,
            flops_source=subject.flops_source,
            tokens_per_sample=subject.tokens_per_sample,
            micro_batch=batch.micro,
            accumulation=batch.accumulation,
            gpus=args.gpus,
            gpus_per_node=args.gpus_per_node,
            precision=p.precision,
            activation_checkpointing=checkpointing,
            fits={c: row["fits"] for c, row in result["candidates"].items()},
            gpu_memory=args.gpu_memory,
        )
    result["plot"] = _plan_cost.write_plot(args.plot, result) if args.plot else None
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


def _flow_yaml(data: dict[str, Any]) -> str:
    """``data`` as one line of YAML (flow style): a job file that fits on a line."""
    import yaml

    return str(yaml.safe_dump(data, default_flow_style=True, sort_keys=False, width=2**31)).strip()


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
    if r["time"] is not None:
        lines += ["", *_plan_cost.render(r["time"])]
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
        lines.append(f"  {_JOB_FILE}: {_flow_yaml(r['job_file'])}")
    else:
        lines.append(f"  job file: strategy: {_flow_yaml(rec['strategy_config'])}")
    lines += [f"note: {n}" for n in r["notes"]]
    if r["plot"] is not None:
        lines.append(f"plot: {r['plot']}")
    return "\n".join(lines)
