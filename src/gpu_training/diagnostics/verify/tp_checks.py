"""The checks ``gpu-training verify`` adds for tensor parallel inside FSDP (``tensor_parallel`` > 1).

One step of the job's 2-D wrap (:func:`~gpu_training.strategy.wrap_model` with the job's
strategy: its mesh, its plan, FSDP per block) on one micro-batch per data-parallel replica,
against a single-process copy of the same model on the whole global batch:

* ``tp_data`` — the batch each rank's step sees hashes equal inside a TP group and differs
  across data-parallel groups (the TP ranks compute one replica together);
* ``tp_grads`` — the step's gradients (full tensors) equal one process's on the same
  global batch within ``1e-5`` (fp32, ``eval()`` mode: dropout draws no masks);
* ``tp_replicated`` — after the optimizer step, the parameters the plan leaves whole on
  the ``tp`` mesh dimension (embeddings, norms) are bitwise equal across a TP group;
* ``tp_sharded`` — the parameters split on the ``tp`` dimension hold different slices on
  the ranks of a TP group (as the plan split them), and after the step their full tensors
  are the same on every rank.

Every function here is a collective: every rank calls it with the same arguments.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

import gpu_training.strategy.tensor_parallel as tensor_parallel
from gpu_training.ddp import DistributedContext
from gpu_training.diagnostics.verify.plan import Batch, CheckResult, LossKind, StepLoss, VerifyPlan
from gpu_training.diagnostics.verify.ranks import gather_objects
from gpu_training.strategy.spec import StrategyConfig
from gpu_training.strategy.wrap import wrap_model

__all__ = ["TP_CHECKS", "TP_TOLERANCE", "check_tensor_parallel"]

TP_CHECKS: tuple[str, ...] = ("tp_data", "tp_grads", "tp_replicated", "tp_sharded")
"""The tensor-parallel checks, in the order they run."""

TP_TOLERANCE = 1e-5
"""Largest ``|g_2d - g_one_process|`` ``tp_grads`` accepts (fp32)."""


def _batch_hash(batch: Batch) -> str:
    digest = hashlib.sha256()
    for tensor in batch:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _tp_dim_placement(param: Any) -> Any:
    """The placement of a DTensor parameter on the ``tp`` mesh dimension (None: a plain one)."""
    mesh = getattr(param, "device_mesh", None)
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return param.placements[names.index("tp")] if "tp" in names else None


def _local(param: Any) -> torch.Tensor:
    local = param.to_local() if hasattr(param, "to_local") else param
    return local.detach().cpu()


def _group_diff(
    named: Sequence[tuple[str, torch.Tensor]], ctx: DistributedContext, degree: int
) -> tuple[float, str]:
    """The largest difference of ``named`` from the first rank of this rank's TP group, over
    every group (and where): one all-gather of each rank's local tensors."""
    views = gather_objects(dict(named), ctx)
    worst, where = 0.0, ""
    for rank, view in enumerate(views):
        first = views[rank - rank % degree]
        for name, tensor in view.items():
            other = first[name]
            diff = (
                float((tensor.double() - other.double()).abs().max())
                if tensor.shape == other.shape
                else float("inf")
            )
            if not diff <= worst:
                worst, where = diff, f"{name} on rank {rank}"
    return worst, where


def _check_data(seen: Batch, ctx: DistributedContext, degree: int) -> CheckResult:
    hashes = gather_objects(_batch_hash(seen), ctx)
    groups = [hashes[g : g + degree] for g in range(0, len(hashes), degree)]
    split = [g for g, group in enumerate(groups) if len(set(group)) > 1]
    firsts = [group[0] for group in groups]
    shared = len(set(firsts)) < len(firsts)
    shown = ", ".join(hashes[:8]) + (", ..." if len(hashes) > 8 else "")
    detail = f"{len(groups)} TP group(s) of {degree}: batch hashes per rank {shown}"
    if split:
        detail += f"; TP group(s) {split} read different batches"
    if shared:
        detail += "; data-parallel groups read the same batch"
    return CheckResult("tp_data", not split and not shared, detail)


def _check_grads(model: nn.Module, reference: nn.Module) -> CheckResult:
    expected = dict(reference.named_parameters())
    worst, where, scale = 0.0, "", 0.0
    for name, param in model.named_parameters():
        grad: Any = param.grad
        full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad  # a collective
        ref = expected[name].grad
        if full is None or ref is None:
            if full is not None or ref is not None:
                worst, where = float("inf"), name
            continue
        diff = float((full.detach().cpu().double() - ref.detach().cpu().double()).abs().max())
        scale = max(scale, float(ref.abs().max()))
        if not diff <= worst:
            worst, where = diff, name
    passed = worst <= TP_TOLERANCE
    detail = (
        f"max |g_2d - g_one_process| = {worst:.3g} (allowed {TP_TOLERANCE:g}, max|g| "
        f"{scale:.3g})" + (f" at {where}" if where and not passed else "")
    )
    return CheckResult("tp_grads", passed, detail)


def _split(model: nn.Module) -> list[tuple[str, Any]]:
    """The parameters the plan splits on the ``tp`` mesh dimension (Shard placements)."""
    from torch.distributed.tensor import Shard

    return [(n, p) for n, p in model.named_parameters() if isinstance(_tp_dim_placement(p), Shard)]


def _identical_slices(model: nn.Module, ctx: DistributedContext, degree: int) -> list[str]:
    """Split parameters whose local slice on some rank equals its TP group's first rank's."""
    local = [(n, _local(p)) for n, p in _split(model)]
    views = gather_objects(dict(local), ctx)
    return sorted(
        {
            name
            for name, _ in local
            for rank, view in enumerate(views)
            if rank % degree and torch.equal(view[name], views[rank - rank % degree][name])
        }
    )


def _check_replicated(model: nn.Module, ctx: DistributedContext, degree: int) -> CheckResult:
    split = {n for n, _ in _split(model)}
    whole = [(n, _local(p)) for n, p in model.named_parameters() if n not in split]
    worst, where = _group_diff(whole, ctx, degree)
    return CheckResult(
        "tp_replicated",
        worst == 0.0,
        f"{len(whole)} parameter(s) whole on the tp dimension: max difference inside a TP "
        f"group after a step {worst:.3g} (bitwise expected)" + (f" at {where}" if worst else ""),
    )


def _check_sharded(
    model: nn.Module, ctx: DistributedContext, identical: Sequence[str]
) -> CheckResult:
    split = _split(model)
    fulls = [(n, p.full_tensor().detach().cpu()) for n, p in split]  # a collective
    worst, where = _group_diff(fulls, ctx, ctx.world_size)
    detail = f"{len(split)} parameter(s) split on the tp dimension: "
    if not split:
        detail += "the plan splits nothing"
    elif identical:
        detail += f"the same slice on the ranks of a TP group: {', '.join(identical[:3])}"
    else:
        detail += "different slices on the ranks of each TP group"
    detail += f"; full tensors after a step: max difference across ranks {worst:.3g}"
    if worst:
        detail += f" at {where}"
    return CheckResult("tp_sharded", bool(split) and not identical and worst == 0.0, detail)


def check_tensor_parallel(
    build_model: Callable[[], nn.Module],
    plan: VerifyPlan,
    strategy: StrategyConfig,
) -> list[CheckResult]:
    """Run the :data:`TP_CHECKS` on one step of the job's 2-D wrap; a collective.

    Args:
        build_model: Returns a fresh model (called after ``torch.manual_seed(plan.seed)``).
        plan: The verify run (its data, loss, seed and device; its context is the world's).
        strategy: The job's strategy (``fsdp`` with ``tensor_parallel`` > 1).

    Returns:
        The four results, identical on every rank.

    Raises:
        StrategyError: When the degree does not divide the world size, or the plan does not
            apply (as a training run would).
    """
    ctx, degree = plan.ctx, strategy.tensor_parallel
    tensor_parallel.check_degree(ctx.world_size, degree)
    # Through the module: what a training run calls, and what a negative control replaces.
    view = tensor_parallel.data_parallel_context(ctx, degree)
    torch.manual_seed(plan.seed)
    model = build_model().to(plan.device)
    model.eval()  # dropout would draw different masks in the two runs
    reference = copy.deepcopy(model)
    loss_kind = LossKind.probe(model, plan.micro_batch(0, view.rank, 0), plan)
    replicas = ctx.world_size // degree
    batches = [plan.micro_batch(0, r, 0) for r in range(replicas)]
    seen = plan.micro_batch(0, view.rank, 0)
    scored = sum(int(plan.count_fn(t)) for _, t in batches) if loss_kind.summed else 0
    wrapped = wrap_model(model, strategy, ctx, device=plan.device)
    wrapped.eval()
    identical = _identical_slices(wrapped, ctx, degree)  # as the plan split them, before a step
    loss = StepLoss(plan.loss_fn, loss_kind.summed, scored, 1, replicas)
    loss(wrapped(seen[0]), seen[1]).backward()
    inputs, targets = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    step = StepLoss(plan.loss_fn, loss_kind.summed, scored, 1, 1)
    step.whole(reference(inputs), targets).backward()
    results = [_check_data(seen, ctx, degree), _check_grads(wrapped, reference)]
    torch.optim.AdamW(wrapped.parameters(), lr=1e-3).step()
    results.append(_check_replicated(wrapped, ctx, degree))
    results.append(_check_sharded(wrapped, ctx, identical))
    return results
