"""The checks of ``gpu-training verify`` that train: gradients, a step, accumulation, a checkpoint.

Each check is a collective (every rank calls it, in
:data:`~gpu_training.diagnostics.verify.report.CHECKS` order) and returns a
:class:`~gpu_training.diagnostics.verify.plan.CheckResult`, identical on every rank.
:func:`check_grad_sync`, :func:`check_params_after_step`, :func:`check_accumulation` and
:func:`check_checkpoint` read their batches from the run's
:class:`~gpu_training.diagnostics.verify.plan.VerifyPlan` and advance the shared
:class:`~gpu_training.diagnostics.verify.plan.VerifyModels` one after the other. Their
reference gradients are computed on the batches the ranks actually drew (gathered), so a
dataset that differs per rank fails ``data``
(:func:`~gpu_training.diagnostics.verify.checks.check_data`), not the gradient checks. Each
step's loss is a :class:`~gpu_training.diagnostics.verify.plan.StepLoss`: normalized as the
Trainer normalizes it, on the ranks (:meth:`StepLoss.__call__`) and in the one process that
computes the reference (:meth:`StepLoss.whole`).
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from gpu_training.ddp import DistributedContext, move_to_device, unwrap_model
from gpu_training.diagnostics.verify.plan import (
    AccumulateFn,
    Batch,
    CheckResult,
    LossFn,
    VerifyModels,
    VerifyPlan,
    default_accumulate,
)
from gpu_training.diagnostics.verify.ranks import (
    diff_from_rank0,
    gather_objects,
    is_distributed,
    wrap_ddp,
)

__all__ = [
    "check_accumulation",
    "check_checkpoint",
    "check_grad_sync",
    "check_params_after_step",
]


# --- the batches the ranks drew, and their gradients --------------------------------------


def _gather_batches(batches: list[Batch], plan: VerifyPlan) -> list[list[Batch]]:
    """Every rank's ``batches``, indexed by rank, on ``plan.device``.

    The reference gradients are computed on these, not on batches read again here: a dataset
    that differs per rank (or draws a random augmentation per read) would otherwise make a
    correct gradient sync look wrong.
    """
    cpu = torch.device("cpu")
    # Through the CPU: a pickled CUDA tensor would unpickle onto the sender's device index.
    gathered = gather_objects(move_to_device(batches, cpu), plan.ctx)
    return [move_to_device(list(b), plan.device) for b in gathered]


def _cat(batches: Sequence[Batch]) -> Batch:
    """One batch holding ``batches`` one after the other."""
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def _grads(model: nn.Module) -> list[tuple[str, torch.Tensor | None]]:
    return [(n, p.grad) for n, p in unwrap_model(model).named_parameters() if p.requires_grad]


def _compare_grads(
    model: nn.Module, reference: nn.Module, rtol: float, atol: float, ctx: DistributedContext
) -> tuple[bool, str]:
    """Whether every rank's gradients match the reference model's; a one-line detail.

    A parameter passes when ``max|g - g_ref| <= atol + rtol * max|g_ref|``.
    """
    expected = dict(_grads(reference))
    largest, failure = 0.0, None
    for name, grad in _grads(model):
        ref = expected.get(name)
        if (grad is None) != (ref is None):
            failure = failure or (float("inf"), name, 0.0, "has a gradient on one side only")
            continue
        if grad is None or ref is None:
            continue
        scale = float(ref.detach().abs().max())
        diff = float((grad.detach().double() - ref.detach().double()).abs().max())
        largest = max(largest, diff)
        if not diff <= atol + rtol * scale and (failure is None or diff > failure[0]):
            failure = (diff, name, scale, "")
    verdicts = gather_objects((largest, failure), ctx)
    for rank, (_, fail) in enumerate(verdicts):
        if fail is not None:
            diff, name, scale, why = fail
            if why:
                return False, f"rank {rank}: '{name}' {why}"
            return False, (
                f"rank {rank}: '{name}' max |Δ| {diff:.3g} vs max |g| {scale:.3g} "
                f"({diff / max(scale, 1e-30):.2g}x; tolerance {atol:g} + {rtol:g}·max|g|)"
            )
    diff = max(v[0] for v in verdicts)
    return True, f"max |Δ| {diff:.2g} (tolerance {atol:g} + {rtol:g}·max|g|)"


def _unused_detail(names: Sequence[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:6])
    more = f" and {len(names) - 6} more" if len(names) > 6 else ""
    return (
        f"{len(names)} parameter(s) get no gradient from forward: {shown}{more}; DDP raises "
        "'Expected to have finished reduction' at the next step: use them, freeze them "
        "(requires_grad=False) or pass find_unused_parameters=True (strategy "
        "find_unused_parameters: true, a graph walk per step)"
    )


# --- gradients ----------------------------------------------------------------------------


def check_grad_sync(plan: VerifyPlan, models: VerifyModels) -> CheckResult:
    """``grad_sync``: one micro-batch per rank through DDP vs their concatenation in one process.

    The step is one micro-batch per rank: a ``(sum, count)`` loss is divided by the scored
    targets of all of them on the ranks, and by those of the concatenation in one process.
    Fails too, naming them, when some parameters get no gradient (``models.unused``): the
    checks then run with ``find_unused_parameters=True``, which the user's DDP lacks.

    Args:
        plan: The run.
        models: The shared models, fresh from :meth:`VerifyModels.build`.

    Returns:
        The verdict, with the largest gradient difference.
    """
    wrapped, reference = models.wrapped, models.reference
    everyone = [b for batches in _gather_batches([models.first], plan) for b in batches]
    loss = models.loss.for_step([models.first], plan.ctx)
    models.optimizer.zero_grad(set_to_none=True)
    loss(wrapped(models.first[0]), models.first[1]).backward()
    reference.zero_grad(set_to_none=True)
    inputs, targets = _cat(everyone)
    loss.whole(reference(inputs), targets).backward()
    ok, detail = _compare_grads(wrapped, reference, plan.rtol, plan.atol, plan.ctx)
    batch = loss.batch(len(inputs))
    verdict = (
        f"DDP gradient vs one process on {batch}: {detail}"
        if ok
        else f"DDP gradient != one process on {batch}: {detail}"
    )
    if models.unused:
        return CheckResult("grad_sync", False, f"{_unused_detail(models.unused)}; {verdict}")
    return CheckResult("grad_sync", ok, verdict)


def check_params_after_step(plan: VerifyPlan, models: VerifyModels) -> CheckResult:
    """``params_after_step``: after one training-mode AdamW step the weights are equal everywhere.

    The forward runs in ``train()`` mode, so a module that changes parameters in its forward
    from its own batch (outside DDP's gradient sync) shows up here.

    Args:
        plan: The run.
        models: The shared models (the step advances them).

    Returns:
        The verdict; a failure names the rank and parameter that differ most.
    """
    wrapped = models.wrapped
    loss = models.loss.for_step([models.first], plan.ctx)
    models.optimizer.zero_grad(set_to_none=True)
    wrapped.train()
    loss(wrapped(models.first[0]), models.first[1]).backward()
    models.optimizer.step()
    wrapped.eval()
    results = diff_from_rank0(list(unwrap_model(wrapped).named_parameters()), plan.ctx)
    rank, (diff, name) = max(enumerate(results), key=lambda item: item[1][0])
    if diff <= plan.atol:
        return CheckResult(
            "params_after_step",
            True,
            f"identical on {plan.ctx.world_size} rank(s) after a train-mode AdamW step "
            f"(max |Δ| {diff:.2g})",
        )
    return CheckResult(
        "params_after_step",
        False,
        f"rank {rank}'s '{name}' differs from rank 0's by {diff:.3g} after one step: "
        "something changes parameters outside DDP's gradient sync",
    )


def check_accumulation(
    plan: VerifyPlan, models: VerifyModels, accumulate: AccumulateFn
) -> CheckResult:
    """``accumulation``: an accumulation window gives the big batch's gradient, syncing once.

    Args:
        plan: The run.
        models: The shared models, after :func:`check_params_after_step`.
        accumulate: Runs one window's forward and backward passes (the user's loop, or
            :func:`default_accumulate`), given the window's :class:`StepLoss`.

    Returns:
        The verdict; a failure says whether the gradient or the all-reduce count is wrong.
    """
    ctx = plan.ctx
    wrapped, reference = models.wrapped, models.reference
    reference.load_state_dict(unwrap_model(wrapped).state_dict())
    models.optimizer.zero_grad(set_to_none=True)
    window = plan.window(1, ctx.rank)
    loss = models.loss.for_step(window, ctx)
    models.counter.syncs = 0
    accumulate(wrapped, window, loss)
    syncs = models.counter.syncs
    big = [b for batches in _gather_batches(window, plan) for b in batches]
    reference.zero_grad(set_to_none=True)
    inputs, targets = _cat(big)
    loss.whole(reference(inputs), targets).backward()
    ok, detail = _compare_grads(wrapped, reference, plan.rtol, plan.atol, ctx)
    problems = []
    if not ok:
        whose = loss.batch(plan.global_batch, "'s")
        problems.append(f"gradient != {whose}: {detail}{_mean_hint(plan, models, big)}")
    synced = gather_objects(syncs, ctx)
    if models.ddp and max(synced) > 1:
        problems.append(
            f"gradients all-reduced on {max(synced):g} of {plan.accum_steps} micro-steps: wrap "
            "the non-final ones in model.no_sync() (gpu_training.ddp.gradient_sync)"
        )
    if problems:
        return CheckResult("accumulation", False, "; ".join(problems))
    return CheckResult(
        "accumulation",
        True,
        f"{plan.accum_steps} micro-steps = {loss.batch(plan.global_batch)}, {detail}; "
        "one all-reduce per window",
    )


def _mean_hint(plan: VerifyPlan, models: VerifyModels, batches: Sequence[Batch]) -> str:
    """Why a mean loss's window may differ from the whole batch: its micro-batches score
    different numbers of targets. Every rank holds ``batches`` (all ranks' micro-batches)."""
    if models.loss.summed:
        return ""
    counts = [int(plan.count_fn(targets)) for _, targets in batches]
    if len(set(counts)) == 1:
        return ""
    return (
        f"; the loss is a mean per micro-batch and the micro-batches score {min(counts)} to "
        f"{max(counts)} targets (-100 not scored): return (sum, count) "
        "(gpu_training.tasks.cross_entropy_sum) and the Trainer normalizes over the whole batch"
    )


# --- checkpoint round-trip ----------------------------------------------------------------


def _shared_tmpdir(ctx: DistributedContext, given: str | os.PathLike[str] | None) -> Path:
    if given is not None:
        return Path(given)
    path = [tempfile.mkdtemp(prefix="gpu-training-verify-") if ctx.is_main_process else ""]
    if is_distributed(ctx):
        dist.broadcast_object_list(path, src=0)
    return Path(path[0])


def _loss(model: nn.Module, batches: Sequence[Batch], loss_fn: LossFn) -> torch.Tensor:
    """The step's loss on this rank: the mean of its micro-batches' (normalized) losses."""
    total = torch.zeros((), dtype=torch.float64)
    for inputs, targets in batches:
        total += loss_fn(model(inputs), targets).detach().double().cpu()
    return total / len(batches)


def _train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[Batch],
    loss_fn: LossFn,
) -> torch.Tensor:
    loss = _loss(model, batches, loss_fn)
    optimizer.zero_grad(set_to_none=True)
    default_accumulate(model, batches, loss_fn)
    optimizer.step()
    return loss


def check_checkpoint(
    plan: VerifyPlan,
    models: VerifyModels,
    build_model: Callable[[], nn.Module],
    checkpoint_dir: str | os.PathLike[str] | None,
) -> CheckResult:
    """``checkpoint``: save, load into a fresh model and optimizer, take the next step.

    The round-trip is :class:`~gpu_training.checkpoint.CheckpointManager` with
    :func:`~gpu_training.resume.capture_training_state`, as the Trainer does it; the next
    step's loss and the weights after it must be bitwise those of the uninterrupted run.

    Args:
        plan: The run.
        models: The shared models (their step continues from the others').
        build_model: Builds the fresh model (with a different seed: only the checkpoint
            can restore the weights).
        checkpoint_dir: A shared directory (None: a temporary one, removed afterwards).

    Returns:
        The verdict; a failure names the rank, both losses and the first differing weights.
    """
    from gpu_training.checkpoint import CheckpointManager
    from gpu_training.resume import capture_training_state, restore_training_state

    ctx, device = plan.ctx, plan.device
    wrapped, optimizer = models.wrapped, models.optimizer
    unused = bool(models.unused)
    directory = _shared_tmpdir(ctx, checkpoint_dir)
    try:
        optimizer.zero_grad(set_to_none=True)
        ckpt = CheckpointManager(directory, ctx=ctx, keep_last_n=1)
        ckpt.save(capture_training_state(ctx, wrapped, optimizer, step=1), step=1)
        # The uninterrupted step runs on a fresh DDP wrap of the same state, as the resumed
        # one does: DDP re-buckets its gradients after its first step, and on 3+ ranks
        # another bucket layout sums in another order (rounding, not the checkpoint).
        ongoing = wrap_ddp(
            copy.deepcopy(unwrap_model(wrapped)), ctx, device, find_unused_parameters=unused
        )
        ongoing.eval()
        ongoing_opt = torch.optim.AdamW(ongoing.parameters(), lr=1e-3)
        ongoing_opt.load_state_dict(copy.deepcopy(optimizer.state_dict()))
        batches = plan.window(2, ctx.rank)
        loss_fn = models.loss.for_step(batches, ctx)
        loss_before = _train_step(ongoing, ongoing_opt, batches, loss_fn)
        after = {k: v.detach().clone() for k, v in unwrap_model(ongoing).state_dict().items()}
        del ongoing, ongoing_opt

        torch.manual_seed(plan.seed + 7919)  # a different init: only the checkpoint can restore it
        fresh = wrap_ddp(build_model().to(device), ctx, device, find_unused_parameters=unused)
        fresh.eval()
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        restore_training_state(ckpt.load(map_location=device), ctx, fresh, fresh_opt)
        loss_after = _train_step(fresh, fresh_opt, batches, loss_fn)
        resumed = unwrap_model(fresh).state_dict()
        differs = [k for k, v in after.items() if not torch.equal(v, resumed[k])]
        del fresh, fresh_opt
    finally:
        if checkpoint_dir is None:
            ctx.barrier()
            if ctx.is_main_process:
                shutil.rmtree(directory, ignore_errors=True)
    verdicts = gather_objects((float(loss_before), float(loss_after), differs[:3]), ctx)
    for rank, (before, again, keys) in enumerate(verdicts):
        if before != again or keys:
            what = f"loss {before!r} before vs {again!r} after the round-trip"
            if keys:
                what += f"; weights differ after the step in {keys}"
            return CheckResult("checkpoint", False, f"rank {rank}: {what}")
    return CheckResult(
        "checkpoint",
        True,
        f"save, load into a fresh model: next step's loss {verdicts[0][0]:.6f} identical "
        "bit for bit, weights after it equal",
    )
