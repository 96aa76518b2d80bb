"""Wrapping a model for one process, DDP or FSDP2, with activation checkpointing per block.

FSDP shards at the *block* level: each repeated block (a transformer layer) becomes one unit
whose parameters are gathered just before it runs and freed after, then the root takes the
rest (embeddings, head). The same blocks are the units of activation checkpointing::

    from gpu_training.strategy import wrap_model, step_fns

    model = wrap_model(model, "fsdp", ctx, mixed_precision="bf16",
                       block_classes={"Block"}, activation_checkpointing=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)   # after wrapping
    stepper = MixedPrecisionStepper(optimizer, precision="bf16", grad_accum_steps=4)
    steps = step_fns(model, stepper)
    for micro_step, (x, y) in enumerate(loader):
        with steps.sync(micro_step):                  # no gradient sync off the boundary
            with steps.autocast():
                loss = loss_fn(model(x), y)
            steps.backward(loss)
        grad_norm = steps.step(micro_step)            # None off the boundary
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpu_training.amp import autocast_dtype, resolve_precision
from gpu_training.ddp import DistributedContext, process_group_up, resolve_device
from gpu_training.memory.measure import repeated_blocks
from gpu_training.step import StepFns, step_fns  # re-exported: the strategies' step loop
from gpu_training.strategy.spec import (
    SHARDINGS,
    StrategyConfig,
    StrategyError,
    did_you_mean,
    parse_strategy,
)
from gpu_training.strategy.tensor_parallel import apply_plan, resolve_plan, two_d_mesh

__all__ = [
    "BlockSpec",
    "StepFns",
    "apply_activation_checkpointing",
    "declared_blocks",
    "detect_blocks",
    "find_blocks",
    "step_fns",
    "wrap_model",
]

BlockSpec = str | type[nn.Module]
"""A block class, or its name (``"Block"``) or qualified name (``"mypkg.model.Block"``)."""


# --- finding the blocks ---------------------------------------------------------------------


def _class_names(model: nn.Module) -> list[str]:
    return sorted({type(m).__name__ for m in model.modules()})


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _outermost(model: nn.Module, match: Callable[[nn.Module], bool]) -> list[tuple[str, nn.Module]]:
    """Matching submodules (root excluded) that are not inside another match, in order."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if module is model or not match(module):
            continue
        if any(name.startswith(f"{outer}.") for outer, _ in found):
            continue
        found.append((name, module))
    return found


def _normalise_specs(block_classes: BlockSpec | Iterable[BlockSpec]) -> list[BlockSpec]:
    if isinstance(block_classes, (str, type)):
        return [block_classes]
    specs = list(block_classes)
    for spec in specs:
        if not isinstance(spec, (str, type)):
            raise StrategyError(
                f"block_classes: expected class names or nn.Module classes, got {spec!r}",
                "strategy.block_classes",
            )
    if not specs:
        raise StrategyError("block_classes: expected at least one class", "strategy.block_classes")
    return specs


def find_blocks(
    model: nn.Module, block_classes: BlockSpec | Iterable[BlockSpec]
) -> list[tuple[str, nn.Module]]:
    """The outermost submodules of the given classes, as ``(qualified name, module)`` pairs.

    A string matches a class's name or its ``module.qualname``; a class matches its instances
    (subclasses included). Every given class must occur in the model: a typo is an error, not a
    model silently left unsharded.

    Args:
        model: The model to search (the root itself is never a block).
        block_classes: One class or name, or several.

    Returns:
        Matching modules in definition order; a match nested in another match is left out.

    Raises:
        StrategyError: If a given class does not occur below the root; the message lists the
            class names the model has, with the closest one.

    Example:
        >>> m = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
        >>> [name for name, _ in find_blocks(m, "Linear")]
        ['0', '2']
    """
    specs = _normalise_specs(block_classes)
    names = {s for s in specs if isinstance(s, str)}
    types = tuple(s for s in specs if isinstance(s, type))

    def match(module: nn.Module) -> bool:
        cls = type(module)
        return cls.__name__ in names or _qualname(cls) in names or isinstance(module, types)

    present = [m for m in model.modules() if m is not model]
    for spec in specs:
        if isinstance(spec, str):
            hit = any(spec in (type(m).__name__, _qualname(type(m))) for m in present)
        else:
            hit = any(isinstance(m, spec) for m in present)
        if not hit:
            label = spec if isinstance(spec, str) else spec.__name__
            if match(model):
                raise StrategyError(
                    f"block class {label!r} is the model itself: name the repeated blocks "
                    "inside it (e.g. the transformer layer class)",
                    "strategy.block_classes",
                )
            classes = _class_names(model)
            raise StrategyError(
                f"block class {label!r} not found in the model{did_you_mean(label, classes)}; "
                f"its classes are: {', '.join(classes)}",
                "strategy.block_classes",
            )
    return _outermost(model, match)


def declared_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks a Hugging Face model declares: the classes its ``_no_split_modules`` names.

    ``transformers`` lists there the modules that must not be split across devices (a
    decoder layer): exactly the FSDP units and checkpointed blocks. Names the model does not
    hold (a vision tower absent from a text-only config) are skipped.

    Returns:
        The outermost such modules in order; empty when the model declares none (any model
        that is not a ``transformers`` one, or a ``peft`` model wrapping one).

    Example:
        >>> declared_blocks(nn.Linear(2, 2))
        []
    """
    names: set[str] = set()
    for module in model.modules():  # a peft model holds the PreTrainedModel inside
        declared = getattr(module, "_no_split_modules", None)
        if isinstance(declared, (list, tuple, set, frozenset)):
            names |= {n for n in declared if isinstance(n, str)}
    present = names & {type(m).__name__ for m in model.modules() if m is not model}
    return find_blocks(model, sorted(present)) if present else []


def detect_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks: its declared ones, else same-class container children.

    A Hugging Face model's ``_no_split_modules`` decide (:func:`declared_blocks`): no class
    names to type. Otherwise, among every ``nn.ModuleList`` and ``nn.Sequential`` holding two
    or more modules of one class that have parameters, picks the group covering the most
    parameters (a transformer's layer stack, not the two linears of an MLP inside each layer):
    :func:`~gpu_training.memory.measure.repeated_blocks`, the scan the memory profile uses.

    Raises:
        StrategyError: If no container holds two or more same-class modules with parameters.

    Example:
        >>> m = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 2))
        >>> [name for name, _ in detect_blocks(m)]
        ['0', '2', '3']
    """
    declared = declared_blocks(model)
    if declared:
        return declared
    best = repeated_blocks(model)
    if not best:
        raise StrategyError(
            "no repeated blocks found to wrap: no nn.ModuleList/nn.Sequential holds two or more "
            "modules of one class; name them with block_classes (the model's classes: "
            f"{', '.join(_class_names(model))})",
            "strategy.block_classes",
        )
    return best


def _blocks(
    model: nn.Module, block_classes: BlockSpec | Iterable[BlockSpec] | None
) -> list[tuple[str, nn.Module]]:
    return detect_blocks(model) if block_classes is None else find_blocks(model, block_classes)


# --- activation checkpointing ---------------------------------------------------------------


def apply_activation_checkpointing(
    model: nn.Module, blocks: Iterable[tuple[str, nn.Module]]
) -> list[nn.Module]:
    """Replace each block in its parent by a non-reentrant ``checkpoint_wrapper`` of it.

    In backward each block's forward runs again instead of its activations being kept
    (the guide's "~60 % less activation memory for ~30 % more compute"). The wrapper's
    state-dict hooks drop its ``_checkpoint_wrapped_module.`` prefix, so checkpoints keep
    the plain model's keys. Already-wrapped blocks are left as they are.

    Args:
        model: The model holding the blocks (changed in place).
        blocks: ``(qualified name, module)`` pairs, e.g. from :func:`find_blocks`.

    Returns:
        The wrappers, in order (shard these, not the inner blocks, so recomputation happens
        inside the FSDP unit while its parameters are gathered).
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointWrapper,
        checkpoint_wrapper,
    )

    wrapped: list[nn.Module] = []
    for name, block in blocks:
        if isinstance(block, CheckpointWrapper):
            wrapped.append(block)
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        wrapper = checkpoint_wrapper(block)
        setattr(parent, attr, wrapper)
        wrapped.append(wrapper)
    return wrapped


# --- wrapping -------------------------------------------------------------------------------


def _check_hybrid(world: int, local: int) -> None:
    if world % local:
        raise StrategyError(
            f"hybrid sharding replicates across nodes and shards within one: the world size "
            f"({world}) must be a multiple of the ranks per node (local_world_size={local})",
            "strategy.sharding",
        )


def _fsdp_mesh(ctx: DistributedContext, device: torch.device, sharding: str) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if sharding == "full":
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    local = ctx.local_world_size
    _check_hybrid(world, local)
    return init_device_mesh(
        device.type, (world // local, local), mesh_dim_names=("replicate", "shard")
    )


def _broadcast_buffers(model: nn.Module, device: torch.device) -> None:
    """Give every rank rank 0's buffers, as DDP does at construction.

    FSDP2 shards parameters only; buffers stay per-rank tensors that it never syncs, so a
    buffer built differently per rank would train every rank with its own, silently.
    """
    for buffer in model.buffers():
        # Staged on the mesh's device: NCCL sends CUDA tensors only, a buffer may sit elsewhere.
        staged = buffer if buffer.device == device else buffer.to(device)
        dist.broadcast(staged, src=0)
        if staged is not buffer:
            buffer.copy_(staged)


def _shard(
    model: nn.Module,
    units: list[nn.Module],
    ctx: DistributedContext,
    device: torch.device,
    *,
    precision: str,
    cpu_offload: bool,
    sharding: str,
    reshard_after_forward: bool,
    mesh: Any = None,
) -> nn.Module:
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    dtype = autocast_dtype(precision)
    # Compute in low precision, reduce gradients in fp32: summing bf16 over ranks loses bits.
    mp_policy = MixedPrecisionPolicy(
        param_dtype=dtype, reduce_dtype=torch.float32 if dtype is not None else None
    )
    # pin_memory=True (the default) fails on a machine without a GPU.
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else None
    mesh = _fsdp_mesh(ctx, device, sharding) if mesh is None else mesh
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": mp_policy,
        "offload_policy": offload if offload is not None else OffloadPolicy(),
        "reshard_after_forward": reshard_after_forward,
    }
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)  # the root last: it takes the parameters no block holds
    with torch.no_grad():
        _broadcast_buffers(model, device)  # FSDP2 does not broadcast buffers (DDP does)
    return model


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def wrap_model(
    model: nn.Module,
    strategy: str | Mapping[str, Any] | StrategyConfig = "ddp",
    ctx: DistributedContext | None = None,
    *,
    device: torch.device | str | None = None,
    block_classes: BlockSpec | Iterable[BlockSpec] | None = None,
    mixed_precision: str = "fp32",
    activation_checkpointing: bool | None = None,
    cpu_offload: bool | None = None,
    sharding: str | None = None,
) -> nn.Module:
    """Prepare ``model`` for ``strategy``: ``none``, ``ddp`` or ``fsdp`` (FSDP2).

    Create the optimizer *after* this call: FSDP replaces the parameters by sharded ones.
    Keyword arguments left as None take their value from ``strategy`` (a
    :class:`StrategyConfig`; a bare name means its defaults).

    - ``none``: the model on ``device``, with checkpointed blocks if asked.
    - ``ddp``: ``DistributedDataParallel`` with gradients as bucket views (no second copy of
      the gradients). Precision is :class:`~gpu_training.amp.MixedPrecisionStepper`'s job.
    - ``fsdp``: ``fully_shard`` on each block, then on the root, then rank 0's buffers
      broadcast to every rank (as DDP does; FSDP2 never syncs buffers itself);
      ``MixedPrecisionPolicy`` with ``param_dtype`` from ``mixed_precision`` and fp32 gradient
      reduction; optional ``CPUOffloadPolicy``; ``sharding="hybrid"`` shards within each node
      and replicates across nodes (a 2-D device mesh of ``world_size / local_world_size`` ×
      ``local_world_size``); ``tensor_parallel: N`` first splits the model's matrices over
      ``N`` ranks by its plan (:mod:`~gpu_training.strategy.tensor_parallel`), then shards
      over the other ``world_size / N``.

    In one process without a process group there is nothing to replicate or shard: ``ddp`` and
    ``fsdp`` return the model as ``none`` does.

    Args:
        model: The plain model (not yet wrapped).
        strategy: A strategy name, a mapping of options or a :class:`StrategyConfig`.
        ctx: This process's context (default: read from the environment).
        device: Where to train (default: :func:`~gpu_training.ddp.resolve_device`).
        block_classes: Classes or class names of the blocks; None uses
            ``strategy.block_classes``, then :func:`detect_blocks`. Only looked up when blocks
            are needed (fsdp, activation checkpointing).
        mixed_precision: ``fp32``, ``bf16``, ``fp16`` or ``auto`` (FSDP's compute dtype).
        activation_checkpointing: Checkpoint each block (none/ddp/fsdp).
        cpu_offload: FSDP: keep sharded parameters, gradients and optimizer state on the CPU.
        sharding: FSDP: ``full`` or ``hybrid``.

    Returns:
        The module to call for forward: ``DistributedDataParallel``, the model itself (now an
        ``FSDPModule`` for fsdp) or the plain model.

    Raises:
        StrategyError: For an unknown strategy or option, ``deepspeed`` (use
            :func:`~gpu_training.strategy.deepspeed_initialize`), a block class the model does
            not have, no repeated blocks to detect, or hybrid sharding on a world size that
            is not a multiple of the ranks per node.
        RuntimeError: When ``ctx`` is distributed but no process group was initialised.
    """
    spec = parse_strategy(strategy)
    ctx = DistributedContext.from_env() if ctx is None else ctx
    dev = torch.device(device) if device is not None else resolve_device(ctx)
    precision = resolve_precision(mixed_precision, dev)
    checkpointing = (
        spec.activation_checkpointing
        if activation_checkpointing is None
        else activation_checkpointing
    )
    offload = spec.cpu_offload if cpu_offload is None else cpu_offload
    mode = spec.sharding if sharding is None else sharding
    if mode not in SHARDINGS:
        raise StrategyError(
            f"sharding must be one of {', '.join(SHARDINGS)}, got {mode!r}{did_you_mean(mode, SHARDINGS)}",
            "strategy.sharding",
        )
    if spec.name == "deepspeed":
        raise StrategyError(
            "strategy 'deepspeed' wraps the model and the optimizer together: use "
            "gpu_training.strategy.deepspeed_initialize (or prepare) instead of wrap_model",
            "strategy.name",
        )
    if spec.name == "fsdp" and mode == "hybrid":
        _check_hybrid(ctx.world_size, ctx.local_world_size)
    names = block_classes if block_classes is not None else spec.block_classes
    # Looked up (and checked) even where unused, so a typo fails on 1 rank as on 64.
    blocks = _blocks(model, names) if checkpointing or spec.name == "fsdp" else []
    grouped = process_group_up()
    if ctx.is_distributed and not grouped and spec.name != "none":
        raise RuntimeError(
            f"strategy {spec.name!r} on {ctx.world_size} ranks needs the process group: "
            "call gpu_training.ddp.init_distributed() first"
        )
    name = spec.name if grouped else "none"  # one process, no group: nothing to spread
    mesh = None
    if name == "fsdp" and spec.tensor_parallel > 1:
        # The plan splits the plain modules first: FSDP then shards the split parameters.
        mesh = two_d_mesh(ctx, dev, spec.tensor_parallel)
        apply_plan(model, mesh["tp"], resolve_plan(model, spec))
        mesh = mesh["dp_shard"]
    if checkpointing:
        units = apply_activation_checkpointing(model, blocks)
    else:
        units = [m for _, m in blocks]
    if name == "fsdp":
        # No model.to(dev): fully_shard moves each unit to the mesh's device as it shards it,
        # so the whole unsharded model never has to fit on one GPU.
        return _shard(
            model,
            units,
            ctx,
            dev,
            precision=precision,
            cpu_offload=offload,
            sharding=mode,
            reshard_after_forward=spec.reshard_after_forward,
            mesh=mesh,
        )
    model.to(dev)
    if name == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model,
            device_ids=[_cuda_index(dev)] if dev.type == "cuda" else None,
            find_unused_parameters=spec.find_unused_parameters,
            gradient_as_bucket_view=True,  # gradients live in the buckets: no second copy
        )
    return model
