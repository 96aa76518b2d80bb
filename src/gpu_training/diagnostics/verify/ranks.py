"""Across ranks, for the checks of ``gpu-training verify``: gather, compare with rank 0, wrap.

Each function is a collective when a process group is up (every rank calls it, at the same
point) and works alone in one process, where there is nothing to compare.

Example:
    >>> import torch
    >>> from gpu_training.ddp import DistributedContext
    >>> gather_objects({"loss": 0.5}, DistributedContext())
    [{'loss': 0.5}]
    >>> diff_from_rank0([("weight", torch.ones(2))], DistributedContext())
    [(0.0, '')]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpu_training.ddp import DistributedContext, process_group_up

__all__ = ["diff_from_rank0", "gather_objects", "is_distributed", "wrap_ddp"]


def is_distributed(ctx: DistributedContext) -> bool:
    """True when ``ctx`` is distributed and its process group is up (else: one process)."""
    return ctx.is_distributed and process_group_up()


def gather_objects(obj: Any, ctx: DistributedContext) -> list[Any]:
    """Every rank's ``obj``, indexed by rank (``[obj]`` in one process)."""
    if not is_distributed(ctx):
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def diff_from_rank0(
    named: Sequence[tuple[str, torch.Tensor | None]], ctx: DistributedContext
) -> list[tuple[float, str]]:
    """Per rank: the largest ``|t - t_rank0|`` over ``named`` and the name where it is.

    The shapes are compared first (a tensor missing, None or shaped differently on a rank is
    an infinite difference there); then one broadcast of rank 0's flattened tensors.
    """
    layout = [(name, None if t is None else tuple(t.shape)) for name, t in named]
    layouts = gather_objects(layout, ctx)
    if any(other != layouts[0] for other in layouts):
        out = []
        for other in layouts:
            pairs = zip(other, layouts[0], strict=False)  # lengths differ when layouts do
            where = next((n for (n, a), (_, b) in pairs if a != b), "")
            if other != layouts[0] and not where:
                where = "the parameter list"
            out.append((float("inf"), where) if other != layouts[0] else (0.0, ""))
        return out
    tensors = [(n, t) for n, t in named if t is not None and t.numel()]
    if not tensors or not is_distributed(ctx):
        return [(0.0, "")] * ctx.world_size if is_distributed(ctx) else [(0.0, "")]
    flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for _, t in tensors])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    deltas = (flat - reference).abs()
    worst, where, offset = 0.0, "", 0
    for name, tensor in tensors:
        size = tensor.numel()
        diff = float(deltas[offset : offset + size].max())
        if not diff <= worst:  # NaN counts as worse than anything
            worst, where = diff, name
        offset += size
    return gather_objects((worst, where), ctx)


def wrap_ddp(
    model: nn.Module,
    ctx: DistributedContext,
    device: torch.device,
    *,
    find_unused_parameters: bool = False,
) -> nn.Module:
    """``model`` in DDP when a process group is up (DDP broadcasts rank 0's weights), else as is."""
    if not is_distributed(ctx):
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(
        model, device_ids=device_ids, find_unused_parameters=find_unused_parameters
    )
