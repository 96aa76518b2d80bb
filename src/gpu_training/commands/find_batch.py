"""``gpu-training find-batch``: the largest per-device batch of a job, and its throughput.

Finds the largest per-device batch of a job by running real training steps (binary search;
an out-of-memory step counts as "does not fit"), or, with ``--gpu-memory``, by the estimate
alone. A job with a ``global_batch_size`` gets the answer in its own terms: the per-device
batch that divides its per-rank share (the whole share when it fits with the safety margin),
the accumulation that follows, and the ``--set`` that applies it; throughput (and MFU) is
measured at that batch::

    $ gpu-training find-batch job.yaml --max-batch 512
    $ gpu-training find-batch job.yaml --gpu-memory 80 --gpus 8 --json   # estimate only

torch is imported inside the run functions only, so ``gpu-training --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpu_training.commands._sizing_inputs import (
    MAX_BATCH,
    MAX_GPUS,
    batch_factory,
    bounded_int,
    parse_margin,
    parse_positive_float,
    parse_size,
)

if TYPE_CHECKING:
    from gpu_training.batch_finder import BatchSearchResult
    from gpu_training.job import JobConfig

__all__ = ["register"]

_MAX_THROUGHPUT_STEPS = 10_000


def register(subparsers: Any) -> None:
    """Add ``find-batch`` to the ``gpu-training`` parser."""
    batch = bounded_int(1, MAX_BATCH)
    find = subparsers.add_parser(
        "find-batch",
        help="the largest per-device batch of a job, and its throughput",
        description=(
            "Binary-search the largest per-device batch of CONFIG by running real training "
            "steps on this device (an out-of-memory step counts as too large), keep a safety "
            "margin, then time a few steps at that batch (samples/s, tokens/s, MFU). A job "
            "with a global_batch_size is answered for that batch: the per-device batch that "
            "divides each rank's share, its accumulation, and the --set to use. With "
            "--gpu-memory, search on the memory estimate instead (no steps run). Under "
            "torchrun every rank probes and all agree on the smallest result."
        ),
    )
    find.add_argument("config", metavar="CONFIG", help="a job file (.yaml or .json)")
    find.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field (repeatable)",
    )
    find.add_argument("--min-batch", type=batch, default=1, metavar="N")
    find.add_argument("--max-batch", type=batch, default=1024, metavar="N")
    find.add_argument("--safety-margin", type=parse_margin, default=0.85, metavar="F")
    find.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    find.add_argument(
        "--gpu-memory",
        type=parse_size,
        metavar="SIZE",
        help="search on the estimate for a GPU of this size (nothing runs)",
    )
    find.add_argument(
        "--gpus",
        type=bounded_int(1, MAX_GPUS),
        default=1,
        metavar="N",
        help="with --gpu-memory: GPUs the strategy shards over",
    )
    find.add_argument(
        "--throughput-steps",
        type=bounded_int(0, _MAX_THROUGHPUT_STEPS),
        default=3,
        metavar="N",
        help="steps timed at the recommended batch (0: skip)",
    )
    find.add_argument(
        "--peak-tflops",
        type=parse_positive_float,
        metavar="T",
        help="this GPU's peak TFLOP/s for MFU (default: the datasheet table, PEAK_TFLOPS)",
    )
    find.add_argument("--json", action="store_true", help="print one JSON document")
    find.set_defaults(_run=_run_find_batch)


def _run_find_batch(args: argparse.Namespace) -> int:
    from gpu_training.cli import UsageError

    if args.min_batch > args.max_batch:
        raise UsageError(
            f"find-batch: --min-batch ({args.min_batch}) must be <= --max-batch ({args.max_batch})"
        )
    import torch

    from gpu_training.job import load_job
    from gpu_training.tasks import build_task

    job = load_job(args.config, list(args.overrides))
    task = build_task(job)
    train_set, _ = task.build_data()
    make_batch = batch_factory(train_set, "find-batch")
    if args.gpu_memory is not None:
        return _find_by_estimate(args, job, task, make_batch)
    from gpu_training.batch_finder import BatchSizeError, make_fits, search_max_batch_size
    from gpu_training.ddp import cleanup_distributed, init_distributed, resolve_device

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("find-batch: --device cuda, but CUDA is not available")
    ctx = init_distributed()
    try:
        share = _per_rank_share(job, ctx.world_size)
        device = resolve_device(ctx) if args.device != "cpu" else torch.device("cpu")
        torch.manual_seed(job.training.seed)
        model = task.build_model().to(device)
        fits = make_fits(model, make_batch, task.loss_fn, precision=job.training.precision)
        try:
            result = search_max_batch_size(
                fits, args.min_batch, args.max_batch, args.safety_margin, ctx=ctx
            )
        except BatchSizeError as err:
            raise UsageError(f"find-batch: {err}") from None
        for_job = _for_job(args, job, result, share, ctx.world_size)
        throughput = None
        if args.throughput_steps:
            throughput = _throughput(
                args,
                job,
                model,
                make_batch,
                task.loss_fn,
                for_job["per_device"] if for_job else result.recommended,
                device,
                ctx.world_size,
            )
    finally:
        cleanup_distributed()
    if not ctx.is_main_process:
        return 0
    report = {
        "mode": "measured",
        "device": str(device),
        "world_size": ctx.world_size,
        **_search_report(result),
        "job": for_job,
        "throughput": throughput,
    }
    _print_find(report, args)
    return 0


def _per_rank_share(job: JobConfig, world_size: int) -> int | None:
    """Each rank's share of the job's global batch (None without one), before any search."""
    from gpu_training.cli import UsageError
    from gpu_training.config import global_batch_split_message

    total = job.training.global_batch_size
    if total is None:
        return None
    if total % world_size:
        raise UsageError(
            f"find-batch: training.global_batch_size {total} does not split over "
            f"{world_size} ranks: {global_batch_split_message(total, 1, world_size)}"
        )
    return total // world_size


def _for_job(
    args: argparse.Namespace,
    job: JobConfig,
    result: BatchSearchResult,
    share: int | None,
    world_size: int,
) -> dict[str, Any] | None:
    """The search's answer for a job with a global batch: per-device, accumulation, command."""
    from gpu_training.batch_finder import per_device_batch_for_share

    if share is None:
        return None
    per_device = per_device_batch_for_share(share, result.recommended)
    setting = f"training.per_device_batch_size={per_device}"
    command = ["gpu-training", "train", args.config]
    command += ["--nproc", str(world_size)] if world_size > 1 else []
    for text in [*args.overrides, setting]:
        command += ["--set", text]
    return {
        "global_batch": job.training.global_batch_size,
        "world_size": world_size,
        "per_rank": share,
        "per_device": per_device,
        "gradient_accumulation_steps": share // per_device,
        "whole_share_fits": per_device == share,
        "set": [setting],
        "command": shlex.join(command),
    }


def _search_report(result: BatchSearchResult) -> dict[str, Any]:
    return {
        "best_fitting": result.best_fitting,
        "recommended": result.recommended,
        "safety_margin": result.safety_margin,
        "probes": [list(p) for p in result.probes],
        "hit_max_batch": result.hit_max_batch,
    }


def _find_by_estimate(
    args: argparse.Namespace, job: JobConfig, task: Any, make_batch: Callable[[int], Any]
) -> int:
    from gpu_training.batch_finder import BatchSizeError, search_max_batch_size
    from gpu_training.cli import UsageError
    from gpu_training.memory import MemoryBudgetError, format_bytes, profile_memory
    from gpu_training.meta_device import meta_device

    spec = job.strategy
    share = _per_rank_share(job, args.gpus)
    with meta_device():
        model = task.build_model()
    precision = job.training.precision if job.training.precision != "auto" else "bf16"
    try:
        profile = profile_memory(
            model,
            make_batch=make_batch,
            loss_fn=task.loss_fn,
            precision=precision,
            device="cuda",
        )

        def fits(batch: int) -> bool:
            est = profile.estimate(
                batch,
                strategy=spec.name,
                zero_stage=spec.zero_stage,
                offload=spec.offload,
                world_size=args.gpus,
                activation_checkpointing=spec.activation_checkpointing,
            )
            return est.total <= args.gpu_memory

        result = search_max_batch_size(fits, args.min_batch, args.max_batch, args.safety_margin)
    except (BatchSizeError, MemoryBudgetError) as err:
        raise UsageError(f"find-batch: {err}") from None
    report = {
        "mode": "estimated",
        "device": f"{args.gpus} x {format_bytes(args.gpu_memory)} GPU (estimate, nothing ran)",
        "world_size": args.gpus,
        **_search_report(result),
        "job": _for_job(args, job, result, share, args.gpus),
        "throughput": None,
    }
    _print_find(report, args)
    return 0


def _throughput(
    args: argparse.Namespace,
    job: JobConfig,
    model: Any,
    make_batch: Callable[[int], Sequence[Any]],
    loss_fn: Callable[..., Any],
    batch_size: int,
    device: Any,
    world_size: int,
) -> dict[str, Any]:
    import torch

    from gpu_training.amp import MixedPrecisionStepper
    from gpu_training.ddp import move_to_device
    from gpu_training.throughput import ThroughputMeter

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-12)  # timing only: barely moves
    stepper = MixedPrecisionStepper(optimizer, precision=job.training.precision, device=device)
    *inputs, target = move_to_device(tuple(make_batch(batch_size)), device)
    tokens = int(target.numel()) if target.dim() >= 2 else None
    fpt_fn = getattr(model, "flops_per_token", None)
    seq = int(target.shape[1]) if target.dim() >= 2 else None
    flops = float(fpt_fn(seq)) if callable(fpt_fn) and tokens else None
    meter = ThroughputMeter(
        flops_per_token=flops,
        peak_tflops=args.peak_tflops,
        world_size=world_size,
        device=device,
        precision=stepper.precision,
    )
    snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.train()
    for step in range(args.throughput_steps + 1):  # step 0 warms up (allocator, kernels)
        if step == 1:
            meter.start()
        with stepper.autocast():
            loss = loss_fn(model(*inputs), target)
        stepper.backward(loss)
        stepper.step(model.parameters(), micro_step=0)
        meter.update(samples=batch_size, tokens=tokens)
    stats = meter.compute()
    model.load_state_dict(snapshot)
    return {
        **stats.to_metrics(),
        "summary": str(stats),
        "steps": stats.steps,
        "peak_tflops": stats.peak_tflops,
    }


def _print_find(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(report, indent=2))
        return
    probes = " ".join(f"{b}{'' if ok else '!'}" for b, ok in report["probes"])
    margin, recommended, job = report["safety_margin"], report["recommended"], report["job"]
    lines = [
        f"largest batch that fits: {report['best_fitting']} ({report['mode']} on "
        f"{report['device']}; probes: {probes}; ! = did not fit)",
    ]
    if job is None:
        lines.append(f"recommended per-device batch: {recommended} ({margin:g} safety margin)")
    else:
        ranks = f"{job['world_size']} rank{'s' if job['world_size'] != 1 else ''}"
        share = f"{job['per_rank']} per rank (global batch {job['global_batch']} over {ranks})"
        if job["whole_share_fits"]:
            lines.append(
                f"with the {margin:g} safety margin: {recommended} per device; this job "
                f"needs {share}, so a per-device batch above {job['per_rank']} is of no use to it"
            )
        else:
            lines.append(
                f"with the {margin:g} safety margin: {recommended} per device, below this "
                f"job's {share}: {job['per_device']}, the largest divisor of {job['per_rank']} "
                f"up to {recommended}, with accumulation"
            )
        lines += [
            f"recommended for this job: per-device {job['per_device']} x accumulation "
            f"{job['gradient_accumulation_steps']} x {ranks} = global {job['global_batch']}",
            *(f"  --set {text}" for text in job["set"]),
            f"  {job['command']}",
        ]
    if report["hit_max_batch"] and (job is None or not job["whole_share_fits"]):
        lines.append("note: --max-batch itself fit: memory may allow more; raise --max-batch")
    if report["throughput"] is not None:
        timed = job["per_device"] if job is not None else recommended
        lines.append(f"throughput at {timed}: {report['throughput']['summary']}")
    print("\n".join(lines))
