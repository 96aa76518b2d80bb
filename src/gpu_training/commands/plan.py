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

For a transformer shape, or a model with a tensor-parallel plan, on several GPUs per node it
also sizes the 2-D layout, FSDP across nodes and tensor parallel inside one
(``strategy: {name: fsdp, tensor_parallel: T}``), and recommends it when FSDP alone does not
fit without offload, or steps slower
(:mod:`~gpu_training.commands._plan_tensor_parallel`).

This module is the command line and the run; its parts are
:mod:`~gpu_training.commands._plan_subject` (what is measured),
:mod:`~gpu_training.commands._plan_recommend` (strategy, batch, learning rate, launch) and
:mod:`~gpu_training.commands._plan_render` (the text it prints).

Its sibling ``gpu-training find-batch`` (:mod:`gpu_training.commands.find_batch`) finds the
largest batch by running real steps instead of estimating.

torch is imported inside the run functions only, so ``gpu-training --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpu_training.commands import _plan_cost
from gpu_training.commands._plan_recommend import (
    choose_for,
    launch_commands,
    layout_of,
    learning_rate,
    plan_batch,
    preference,
)
from gpu_training.commands._plan_render import render
from gpu_training.commands._plan_subject import measure_subject
from gpu_training.commands._plan_tensor_parallel import tensor_parallel_option

# parse_size is public here too: users and tests import it from this module.
from gpu_training.commands._sizing_inputs import (
    MAX_BATCH,
    MAX_DIMENSION,
    MAX_GPUS,
    bounded_int,
    parse_margin,
    parse_number,
    parse_positive_float,
    parse_size,
)

__all__ = ["parse_count", "parse_size", "register"]

_COUNT_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
_MAX_PARAMS = 10**15  # a thousand times today's largest models: beyond is a typo


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
            "it out per GPU for DDP, ZeRO-1/2, FSDP, ZeRO-3 + CPU offload and, for a "
            "transformer shape, FSDP + tensor parallel, and recommend a "
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
        help="an option of the task / model factory (repeatable), e.g. n_layer=8; with "
        "--hf-config, task_options the printed job carries (tokenizer=DIR, train_files=[...])",
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
    hw.add_argument(
        "--tensor-parallel",
        type=gpus,
        metavar="T",
        help="plan FSDP + tensor parallel over T GPUs of a node (1: never; default: when "
        "FSDP alone does not fit without offload, or steps slower); a model needs a plan: "
        "its own or the job file's strategy.tp_plan",
    )
    hw.add_argument("--global-batch", type=batch, metavar="G", help="samples per step")
    hw.add_argument("--micro-batch", type=batch, metavar="B", help="per-device batch")
    hw.add_argument("--precision", choices=("auto", "bf16", "fp16", "fp32"))
    hw.add_argument("--optimizer", choices=("adamw", "adam", "sgd", "sgd_momentum"))
    hw.add_argument(
        "--foreach-optimizer",
        action="store_true",
        help="plan a loop whose optimizer is torch's foreach default on CUDA (scratch the size "
        "of the parameter shard during the step); default: fused, in place, as the Trainer's "
        "AdamW on CUDA (and torchtitan's)",
    )
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


# --- the run ------------------------------------------------------------------------------


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
    subject = measure_subject(args)
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
    choices = [(choose_for(subject, args, probe, ckpt), ckpt) for ckpt in modes]
    choice, checkpointing = min(choices, key=lambda c: (preference(c[0]), c[1]))
    layout = layout_of(choice)
    batch = plan_batch(subject, args, layout, checkpointing)
    table_batch, table_checkpointing = batch, checkpointing  # the 1-D rows' batch
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
    tp = tensor_parallel_option(subject, args, choice, checkpointing, batch, cost)
    rows: dict[str, dict[str, Any]] = {
        c: {**e.breakdown(), "fits": e.fits(args.gpu_memory)} for c, e in table.items()
    }
    recommended: dict[str, Any] = {
        "strategy": choice.strategy,
        "zero_stage": choice.zero_stage,
        "offload": choice.offload,
        "layout": layout,
        "fits": choice.fits,
        "min_gpus_full_sharding": choice.min_gpus,
        "reason": choice.reason,
        "tensor_parallel": 1,
        "activation_checkpointing": checkpointing,
    }
    if tp is not None:
        rows[tp.name] = {
            **tp.estimate.breakdown(),
            "fits": tp.estimate.fits(args.gpu_memory),
            "per_device_batch": tp.batch.micro,
            "activation_checkpointing": tp.checkpointing,
        }
        if tp.recommended:
            layout, checkpointing, batch = "fsdp", tp.checkpointing, tp.batch
            recommended.update(
                strategy="fsdp",
                zero_stage=None,
                offload="none",
                layout=layout,
                fits=tp.fits,
                min_gpus_full_sharding=None,
                reason=tp.reason,
                tensor_parallel=tp.degree,
                activation_checkpointing=checkpointing,
            )
    t = tp.degree if tp is not None and tp.recommended else 1
    lr = learning_rate(subject, args, batch.global_batch)
    launch = launch_commands(subject, args, layout, checkpointing, batch, t)
    recommended["strategy_config"] = launch.strategy
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
        "activation_checkpointing": table_checkpointing,
        "micro_batch": table_batch.micro,
        "decision_batch": probe,
        "candidates": rows,
        "recommended": recommended,
        "tensor_parallel": None if tp is None else {"name": tp.name, "reason": tp.reason},
        "batch": {
            "per_device": batch.micro,
            "gradient_accumulation_steps": batch.accumulation,
            "global": batch.global_batch,
            "data_parallel": args.gpus // t,
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
            micro_batch=table_batch.micro,
            accumulation=table_batch.accumulation,
            gpus=args.gpus,
            gpus_per_node=args.gpus_per_node,
            precision=p.precision,
            activation_checkpointing=table_checkpointing,
            fits={c: rows[c]["fits"] for c in table},
            gpu_memory=args.gpu_memory,
            two_d=None if tp is None else tp.run,
            two_d_fits=rows[tp.name]["fits"] if tp is not None else False,
        )
    result["plot"] = _plan_cost.write_plot(args.plot, result) if args.plot else None
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(render(result, args))
    return 0
