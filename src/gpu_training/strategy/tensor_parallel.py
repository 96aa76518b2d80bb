"""Tensor parallel inside FSDP2: the 2-D device mesh, the model's plan, the data-parallel view.

``strategy: {name: fsdp, tensor_parallel: N}`` lays the ranks out as a mesh of
``world / N`` data-parallel rows × ``N`` tensor-parallel columns (``("dp_shard", "tp")``,
torchtitan's names; rank ``r`` sits at row ``r // N``, column ``r % N``, so one TP group is
``N`` consecutive ranks: one node's). Each layer's matrices are split over a row's ``N``
ranks by a *plan*, then FSDP2 shards every block over the column's ranks::

    mesh = two_d_mesh(ctx, device, 2)
    apply_plan(model, mesh["tp"], resolve_plan(model, spec))
    # then fully_shard(block, mesh=mesh["dp_shard"]) per block, as wrap_model does

The ``N`` ranks of one TP group compute one data-parallel replica: they read the same
samples and draw the same random streams (:func:`data_parallel_context` is the rank and
world size the sampler, the batch split and the step see).
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from gpu_training.ddp import DistributedContext
from gpu_training.strategy.spec import TP_STYLES, StrategyConfig, StrategyError
from gpu_training.tasks import TaskError, resolve_import

__all__ = [
    "PlanFunction",
    "apply_plan",
    "check_degree",
    "check_plan",
    "data_parallel_context",
    "model_plan",
    "resolve_plan",
    "two_d_mesh",
]

PlanFunction = Callable[[nn.Module, Any], None]
"""A plan as code: ``function(model, tp_mesh)`` parallelizes the model in place."""


def data_parallel_context(ctx: DistributedContext, tensor_parallel: int) -> DistributedContext:
    """This rank as the data sees it: its TP group is one replica, ``world / N`` of them.

    The rank and world size are the data-parallel ones; the local rank stays the process's
    (it picks the GPU).

    Example:
        >>> ctx = DistributedContext(rank=3, local_rank=3, world_size=4, local_world_size=4)
        >>> view = data_parallel_context(ctx, 2)
        >>> view.rank, view.world_size, view.local_rank
        (1, 2, 3)
    """
    if tensor_parallel <= 1:
        return ctx
    return DistributedContext(
        rank=ctx.rank // tensor_parallel,
        local_rank=ctx.local_rank,  # still the process's own GPU
        world_size=ctx.world_size // tensor_parallel,
        local_world_size=ctx.local_world_size,
        backend=ctx.backend,
    )


def check_degree(world_size: int, tensor_parallel: int) -> None:
    """Refuse a tensor-parallel degree that does not divide the world size (one line)."""
    if tensor_parallel > 1 and world_size % tensor_parallel:
        raise StrategyError(
            f"field 'strategy.tensor_parallel': {tensor_parallel} does not divide the world "
            f"size ({world_size} ranks); expected a divisor of it",
            "strategy.tensor_parallel",
        )


def two_d_mesh(ctx: DistributedContext, device: torch.device, tensor_parallel: int) -> Any:
    """The ``(dp_shard, tp)`` device mesh of ``world / N`` × ``N`` ranks (every rank calls it)."""
    from torch.distributed.device_mesh import init_device_mesh

    check_degree(ctx.world_size, tensor_parallel)
    shape = (ctx.world_size // tensor_parallel, tensor_parallel)
    return init_device_mesh(device.type, shape, mesh_dim_names=("dp_shard", "tp"))


def model_plan(model: nn.Module) -> dict[str, str] | None:
    """The plan a model ships: a Hugging Face model's ``config.base_model_tp_plan`` (its
    decoder layers' projections) prefixed with where its base model sits, else the model's
    own ``tp_plan`` (the built-in model's).

    Returns:
        Module-name patterns → styles, or None when the model ships none.
    """
    base_plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
    base = getattr(model, "base_model", None)
    if isinstance(base_plan, Mapping) and base_plan and isinstance(base, nn.Module):
        prefix = next((name for name, module in model.named_modules() if module is base), "")
        dot = f"{prefix}." if prefix else ""
        return {f"{dot}{pattern}": str(style) for pattern, style in base_plan.items()}
    own = getattr(model, "tp_plan", None)
    return dict(own) if isinstance(own, Mapping) and own else None


def resolve_plan(model: nn.Module, spec: StrategyConfig) -> dict[str, str] | PlanFunction:
    """The job's plan (patterns or an import string), else the model's own.

    Raises:
        StrategyError: When neither the job nor the model gives a plan, or the import
            string does not name a callable.
    """
    plan = spec.tp_plan
    if isinstance(plan, str):
        try:
            return resolve_import(plan)
        except TaskError as exc:
            raise StrategyError(f"field 'strategy.tp_plan': {exc}", "strategy.tp_plan") from None
    if plan is not None:
        return dict(plan)
    shipped = model_plan(model)
    if shipped is None:
        raise StrategyError(
            f"field 'strategy.tp_plan': {type(model).__name__} ships no tensor-parallel plan; "
            "give one (module-name patterns -> colwise/rowwise, or 'module:function')",
            "strategy.tp_plan",
        )
    return shipped


def _style(name: str, style: str) -> list[Any]:
    """The torch parallel styles that apply ``style`` to module ``name``, in order."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    if style not in TP_STYLES:  # a shipped plan may use transformers' own styles
        raise StrategyError(
            f"field 'strategy.tp_plan': {name} uses style {style!r}, which this toolkit does "
            f"not apply (it knows {', '.join(TP_STYLES)}): give a plan in the job file",
            "strategy.tp_plan",
        )
    if style == "colwise":
        return [ColwiseParallel()]
    if style == "colwise_qkv":
        return [_packed_colwise(3)]
    if style == "rowwise":
        return [RowwiseParallel()]
    # Whole activations in and out: each rank runs the module on its slice of the sequence,
    # then one all-gather, so the plan's neighbours need no sequence-sharded layout.
    return [
        PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),)),
        SequenceParallel(),
        PrepareModuleOutput(output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),)),
    ]


def _packed_colwise(pieces: int) -> Any:
    """``ColwiseParallel`` for a Linear whose output packs ``pieces`` equal parts (``[q | k |
    v]``), so that rank ``r`` of ``N`` computes rows ``r/N`` of each part (whole heads).

    The weight stays ``Shard(0)``, contiguous rows as plain ``colwise`` keeps them, so its
    checkpoints and every other layout read it as one process's; each forward regroups it
    into ``[q_r; k_r; v_r]`` (a ``_StridedShard``: one exchange of the weight, and of its
    gradient in backward). The Linear gets ``packed_shard = (r, N)``.
    """
    import torch.nn.functional as F
    from torch.distributed.tensor.parallel import ColwiseParallel
    from torch.distributed.tensor.placement_types import _StridedShard

    strided = [_StridedShard(0, split_factor=pieces)]

    def forward(module: nn.Module, inputs: Any) -> Any:
        weight: Any = module.weight  # DTensors (Shard(0)) on the TP mesh
        bias: Any = module.bias
        bias = None if bias is None else bias.redistribute(placements=strided)
        return F.linear(inputs, weight.redistribute(placements=strided), bias)

    class PackedColwise(ColwiseParallel):
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            if not isinstance(module, nn.Linear):
                raise NotImplementedError("colwise_qkv splits an nn.Linear only")
            module.packed_shard = (device_mesh.get_local_rank(), device_mesh.size())  # type: ignore[assignment]
            # Regrouped at every call: FSDP2 swaps its gathered weight in for each forward.
            module.forward = functools.partial(forward, module)  # type: ignore[method-assign]
            return super()._apply(module, device_mesh)

        @staticmethod
        def _prepare_output_fn(layouts: Any, local: bool, mod: Any, out: Any, mesh: Any) -> Any:
            return out.to_local()  # already this rank's [q_r | k_r | v_r]: no redistribution

    return PackedColwise()


def _matches(model: nn.Module, plan: Mapping[str, str]) -> dict[str, str]:
    names = [name for name, _ in model.named_modules() if name]
    chosen: dict[str, str] = {}
    for pattern, style in plan.items():
        hits = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not hits:
            raise StrategyError(
                f"field 'strategy.tp_plan': pattern {pattern!r} matches no module of "
                f"{type(model).__name__}",
                "strategy.tp_plan",
            )
        chosen.update(dict.fromkeys(hits, style))
    return chosen


_HEADS = {
    "num_attention_heads": "attention heads",
    "num_key_value_heads": "key value heads",
    "n_head": "attention heads",  # the built-in model's, split by its colwise_qkv
}


def _check_heads(model: nn.Module, degree: int, styles: set[str]) -> None:
    config = getattr(model, "config", None)
    for field, what in _HEADS.items():
        heads = getattr(config, field, None)
        if field == "n_head" and "colwise_qkv" not in styles:
            continue  # its attention stays whole
        if isinstance(heads, int) and heads % degree:
            raise StrategyError(
                f"field 'strategy.tensor_parallel': {degree} ranks cannot split the model's "
                f"{heads} {what} (each keeps whole heads)",
                "strategy.tensor_parallel",
            )


def check_plan(model: nn.Module, plan: Mapping[str, str], degree: int) -> dict[str, str]:
    """The modules ``plan`` splits (name → style), checked for ``degree`` ranks.

    Runs on a model built on ``meta`` before any process starts, and again when applied.

    Raises:
        StrategyError: For a pattern that matches no module, a style this toolkit does not
            apply, a width or a head count ``degree`` does not divide.
    """
    chosen = _matches(model, plan)
    for name, style in chosen.items():
        _style(name, style)
        module = model.get_submodule(name)
        width = getattr(module, "in_features" if style == "rowwise" else "out_features", None)
        parts = 3 if style == "colwise_qkv" else 1  # each of q, k, v splits
        if style != "sequence_parallel" and isinstance(width, int) and width % (degree * parts):
            raise StrategyError(
                f"field 'strategy.tensor_parallel': {name} has {width} features to split "
                f"{style}, which {degree} ranks do not divide",
                "strategy.tensor_parallel",
            )
    _check_heads(model, degree, set(chosen.values()))
    return chosen


def apply_plan(model: nn.Module, tp_mesh: Any, plan: Mapping[str, str] | PlanFunction) -> None:
    """Split the model's modules over ``tp_mesh`` as ``plan`` says (in place, before FSDP).

    Raises:
        StrategyError: As :func:`check_plan`, or for a module the style cannot split.
    """
    if callable(plan):
        plan(model, tp_mesh)
        return
    from torch.distributed.tensor.parallel import parallelize_module

    for name, style in check_plan(model, plan, tp_mesh.size()).items():
        module = model.get_submodule(name)
        try:
            for torch_style in _style(name, style):  # hooks run in the order registered
                parallelize_module(module, tp_mesh, torch_style)
        except (NotImplementedError, ValueError, AssertionError) as exc:
            raise StrategyError(
                f"field 'strategy.tp_plan': {name} ({type(module).__name__}) cannot be split "
                f"{style}: {exc}",
                "strategy.tp_plan",
            ) from None
