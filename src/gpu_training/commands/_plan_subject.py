"""What ``gpu-training plan`` measures: a shape, a task, an import string, a job file or an HF config.

:func:`measure_subject` turns the command line into a :class:`Subject`: the model's
:class:`~gpu_training.memory.MemoryProfile` (measured on fake tensors, on the meta device)
and what the plan needs beside it (precision, optimizer, the job to launch, FLOPs per token).
torch is imported inside the functions only.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_training.commands._plan_model_split import ModelSplit, model_split
from gpu_training.commands._sizing_inputs import batch_factory

if TYPE_CHECKING:
    from gpu_training.job import JobConfig
    from gpu_training.memory import MemoryProfile, TransformerShape

__all__ = ["Subject", "measure_subject"]

_JOB_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class Subject:
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
    shape: TransformerShape | None = None
    """For a transformer shape: its layers, heads and widths (what tensor parallel splits)."""
    split: ModelSplit | None = None
    """For a model: its tensor-parallel plan and what it splits (or why it has none)."""


def _options(pairs: Sequence[str]) -> dict[str, Any]:
    from gpu_training.cli import UsageError
    from gpu_training.config import ConfigError, parse_override

    try:
        return dict(parse_override(text) for text in pairs)
    except ConfigError as err:
        raise UsageError(f"--task-option: {err}") from None


def measure_subject(args: argparse.Namespace) -> Subject:
    """Measure what the command line names: a shape, a task, an import string, a job file or
    an HF config.

    Raises:
        UsageError: For conflicting or missing flags, or a model the estimate cannot measure.
    """
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
                fused=not args.foreach_optimizer,
            )
        except MemoryBudgetError as err:
            raise UsageError(f"plan: {err}") from None
        described = (
            f"{shape.arch} transformer, {shape.num_layers} layers x {shape.hidden_size} hidden, "
            f"{shape.heads} heads, seq {shape.seq_len}, vocab {shape.vocab_size}"
        )
        from gpu_training.cost import shape_flops_per_token

        return Subject(
            profile,
            described,
            precision,
            optimizer,
            flops_per_token=shape_flops_per_token(shape, profile.num_params),
            flops_source="6N + 12LHQT of the shape (N without the embedding lookups)",
            tokens_per_sample=shape.seq_len,
            shape=shape,
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
        # --task-option (tokenizer, train_files...) reaches the printed job: then it trains.
        hf_options = {"config": args.hf_config, "block_size": task.tokens_per_sample}
        sections = {"task": "hf", "task_options": {**hf_options, **options}}
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
    split = model_split(model, job)
    train_set, _ = task.build_data()
    try:
        profile = profile_memory(
            model,
            make_batch=batch_factory(train_set, "plan"),
            loss_fn=task.loss_fn,
            precision=precision,
            optimizer=optimizer,
            device="cuda",
            fused=not args.foreach_optimizer,
        )
    except MemoryBudgetError as err:
        raise UsageError(f"plan: {err}") from None
    described = task.describe or task.name
    job_path = args.model if job is not None else None
    return Subject(
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
        split=split,
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
