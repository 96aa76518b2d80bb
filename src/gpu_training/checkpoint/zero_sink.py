"""Per-parameter full state written into a DeepSpeed ZeRO-1/2/3 engine's own partitions.

The other direction of :mod:`~gpu_training.checkpoint.zero_source`: given each trainable
parameter whole (weight, optimizer moments, step) from any checkpoint, every rank keeps its
own partition of the fp32 master weights and of the moments, and its own copy (ZeRO-1/2) or
partition (ZeRO-3) of the model's weights. No collective, except ZeRO-3's own partition and
gather of its parameters around the fill (what ``engine.load_checkpoint`` calls too):
:class:`EngineSink` splits them out (:meth:`~EngineSink.begin`, :meth:`~EngineSink.end`) so
that a failed fill is known on every rank before anyone enters them.

This reaches inside the ZeRO optimizer, where DeepSpeed's own universal-checkpoint loader
reaches (``load_hp_checkpoint_state``): ZeRO-1/2's ``bit16_groups``,
``single_partition_of_fp32_groups`` and each parameter's ``_hp_mapping`` (which slice of it
this rank's partition holds); ZeRO-3's ``fp16_groups``, ``fp32_partitioned_groups_flat`` and
``fp16_partitioned_groups_flat``. The base optimizer's state is set as torch keys it: by the
flat partition tensor. Checked against DeepSpeed 0.19: ``tests/test_zero_reshard.py`` reads
every stage back through DeepSpeed's public ``safe_get_full_*`` getters, and
``tests/test_resume_matrix.py`` resumes every layout into every other.

Why not DeepSpeed's universal checkpoint (``ds_to_universal``, ``load_universal``): it
rewrites the whole state to disk per parameter first, needs the engine built in universal
mode (read at initialisation), and its loader unpickles with ``weights_only=False``.

Example:
    >>> load_into_engine(engine, source)  # every rank, a freshly built engine  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from gpu_training.checkpoint.files import CheckpointError
from gpu_training.checkpoint.full_state import (
    ParamSource,
    ParamState,
    batches,
    check_names,
)
from gpu_training.checkpoint.keys import parameter_name

__all__ = ["EngineSink", "engine_order", "load_into_engine"]


def _names(engine: Any) -> dict[int, str]:
    return {id(p): parameter_name(n) for n, p in engine.module.named_parameters()}


def _groups(engine: Any) -> list[list[torch.nn.Parameter]]:
    """The engine's trainable parameters by ZeRO group (ZeRO-3: by sub-group), in order."""
    optimizer = engine.optimizer
    if engine.zero_optimization_stage() == 3 and hasattr(optimizer, "fp16_groups"):
        return [list(g) for g in optimizer.fp16_groups]
    if engine.zero_optimization_stage() in (1, 2) and hasattr(optimizer, "bit16_groups"):
        return [list(g) for g in optimizer.bit16_groups]
    if engine.zero_optimization_stage() in (1, 2, 3):  # BF16_Optimizer: data_types at stage 1
        raise CheckpointError(
            f"resharding fills DeepSpeed's ZeRO optimizers; this engine runs "
            f"{type(optimizer).__name__} (its config's data_types): resume at the layout the "
            "checkpoint was written with"
        )
    raise CheckpointError(
        f"resharding fills ZeRO stages 1-3; this engine runs stage "
        f"{engine.zero_optimization_stage()}: resume at the layout it was written with"
    )


def engine_order(engine: Any) -> list[list[str]]:
    """The engine's trainable parameter names by its optimizer's param group, in order.

    What index ``i`` of a plain checkpoint's optimizer state is (the client optimizer was
    built from ``model.parameters()`` under every strategy).
    """
    names = _names(engine)
    groups = _groups(engine)
    if engine.zero_optimization_stage() == 3:  # sub-groups back into their param groups
        by_group: dict[int, list[str]] = {}
        for sub, params in enumerate(groups):
            owner = int(engine.optimizer.sub_group_to_group_id[sub])
            by_group.setdefault(owner, []).extend(names[id(p)] for p in params)
        return [by_group[k] for k in sorted(by_group)]
    return [[names[id(p)] for p in params] for params in groups]


class EngineSink:
    """A freshly built ZeRO engine, as resharding fills it (a :class:`~.full_state.Sink`).

    Its base optimizer must not have stepped yet (its state is set, not merged). The learning
    rate stays as built: the LR schedule's restore sets it.

    Args:
        engine: The ``DeepSpeedEngine`` (ZeRO stage 1, 2 or 3; CPU offload or not).
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.order = engine_order(engine)
        self._zero3 = engine.zero_optimization_stage() == 3

    def check(self, source: ParamSource) -> None:
        """A fresh engine in memory, and the source holds its parameters, of the same shapes."""
        if self.engine.zero_nvme_offload_optimizer():
            raise CheckpointError(
                "resharding fills optimizer state in memory; this engine swaps it to NVMe: "
                "resume at the layout the checkpoint was written with"
            )
        if self.engine.optimizer.optimizer.state:
            raise CheckpointError("resharding loads into a freshly built engine (it has stepped)")
        names = _names(self.engine)
        groups = _groups(self.engine)
        check_names(source, {names[id(p)]: _shape(p) for g in groups for p in g})

    def begin(self) -> None:
        """ZeRO-3: every parameter partitioned, as DeepSpeed's load does first (a collective)."""
        if self._zero3:
            self.engine.optimizer.checkpoint_event_prologue()

    def fill(self, source: ParamSource) -> None:
        """This rank's partitions of the weights and optimizer state, and the buffers."""
        groups, names = _groups(self.engine), _names(self.engine)
        fill = _fill_zero3 if self._zero3 else _fill_zero12
        fill(self.engine, groups, names, source)
        buffers = {parameter_name(n): b for n, b in self.engine.module.named_buffers()}
        with torch.no_grad():
            for name, value in source.buffers(list(buffers)).items():
                buffers[name].copy_(value)

    def end(self) -> None:
        """ZeRO-3: the persistent parameters gathered again (a collective)."""
        if self._zero3:
            self.engine.optimizer.checkpoint_event_epilogue()


def load_into_engine(engine: Any, source: ParamSource) -> None:
    """Fills a freshly built ZeRO engine from ``source``: :class:`EngineSink`, every rank.

    Raises:
        CheckpointError: The source's parameters differ from the model's, the engine runs
            another stage, offloads to NVMe, or has stepped already.
    """
    sink = EngineSink(engine)
    sink.check(source)
    sink.begin()
    sink.fill(source)
    sink.end()


def _shape(param: torch.nn.Parameter) -> tuple[int, ...]:
    """A parameter's full shape (ZeRO-3 keeps only a partition in ``param``)."""
    return tuple(getattr(param, "ds_shape", param.shape))


def _read(
    source: ParamSource, params: Sequence[torch.nn.Parameter], names: dict[int, str]
) -> Iterator[tuple[Any, ParamState]]:
    # Any: DeepSpeed's parameters carry its own attributes (ds_numel, _hp_mapping...)
    """``params`` with their full state, as many per read as the source takes."""
    by_name = {names[id(p)]: p for p in params}
    sizes = {n: math.prod(_shape(p)) * 4 * 3 for n, p in by_name.items()}
    for batch in batches(list(by_name), sizes, source.batch_bytes):
        for name, full in source.read(batch).items():
            yield by_name[name], full


def _flat_state(
    base: torch.optim.Optimizer, flat: torch.Tensor, moments: dict[str, torch.Tensor], step: Any
) -> None:
    """The base optimizer's state for one flat partition, as it keys it (by the tensor)."""
    if not moments:
        return  # the checkpoint's run had not stepped: nothing to carry
    if step is None:
        raise CheckpointError("its optimizer state has moments but no step count")
    # DeepSpeed's own Adams count steps in a Python int, torch's in a tensor
    own = type(base).__module__.startswith("deepspeed.")
    count: Any = int(step) if own else torch.as_tensor(step, dtype=torch.float32).clone()
    base.state[flat] = {"step": count, **moments}


def _fill_zero12(
    engine: Any,
    groups: list[list[torch.nn.Parameter]],
    names: dict[int, str],
    source: ParamSource,
) -> None:
    """ZeRO-1/2: every rank the whole model, and its slice of each group's flat fp32 state."""
    optimizer = engine.optimizer
    base = optimizer.optimizer
    with torch.no_grad():
        for g, params in enumerate(groups):
            flat = optimizer.single_partition_of_fp32_groups[g]
            moments: dict[str, torch.Tensor] = {}
            steps: list[torch.Tensor] = []
            for param, full in _read(source, params, names):
                param.data.copy_(full.weight.reshape(param.shape))
                mapping = getattr(param, "_hp_mapping", None)
                if mapping is None:  # no element of it in this rank's partition
                    continue
                lp, hp = mapping.lp_fragment_address, mapping.hp_fragment_address
                flat.narrow(0, hp.start, hp.numel).copy_(
                    full.weight.reshape(-1).narrow(0, lp.start, lp.numel)
                )
                _copy_state(full.state, flat, moments, steps, hp.start, lp.start, hp.numel)
            _flat_state(base, flat, moments, _one_step(steps))


def _fill_zero3(
    engine: Any,
    groups: list[list[torch.nn.Parameter]],
    names: dict[int, str],
    source: ParamSource,
) -> None:
    """ZeRO-3: this rank's piece of every parameter, of its fp32 copy and of its moments."""
    optimizer = engine.optimizer
    base = optimizer.optimizer
    with torch.no_grad():
        for sub, params in enumerate(groups):
            flat = optimizer.fp32_partitioned_groups_flat[sub]
            moments: dict[str, torch.Tensor] = {}
            steps: list[torch.Tensor] = []
            offset = 0
            for param, full in _read(source, params, names):
                piece = param.partition_numel()
                rank = dist.get_rank(group=getattr(param, "ds_process_group", None))
                start = min(rank * piece, param.ds_numel)
                count = min(piece, param.ds_numel - start)
                flat.narrow(0, offset, count).copy_(full.weight.reshape(-1).narrow(0, start, count))
                _copy_state(full.state, flat, moments, steps, offset, start, count)
                offset += piece
            _flat_state(base, flat, moments, _one_step(steps))
            # the model's own partition from the fp32 one, as DeepSpeed's load does
            lp_flat = optimizer.fp16_partitioned_groups_flat[sub]
            lp_flat.copy_(flat)
            unflat = optimizer.unflatten(lp_flat, optimizer.fp16_partitioned_groups[sub])
            for partitioned, view in zip(
                optimizer.fp16_partitioned_groups[sub], unflat, strict=True
            ):
                partitioned.data = view.data


def _copy_state(
    state: dict[str, torch.Tensor],
    flat: torch.Tensor,
    moments: dict[str, torch.Tensor],
    steps: list[torch.Tensor],
    at: int,
    start: int,
    count: int,
) -> None:
    """One parameter's optimizer state into this rank's flat partition: ``count`` elements
    of each moment from ``start`` of the full tensor to ``at`` of the flat one (a moment's
    flat buffer made on first sight); 0-d step counts collected in ``steps``."""
    for key, value in state.items():
        if value.dim() == 0:
            steps += [value] if key == "step" else []
            continue
        if key not in moments:
            moments[key] = torch.zeros_like(flat)
        moments[key].narrow(0, at, count).copy_(value.reshape(-1).narrow(0, start, count))


def _one_step(steps: list[torch.Tensor]) -> torch.Tensor | None:
    """The one step count of a flat partition's parameters (None: no state to carry)."""
    counts = {float(s) for s in steps}
    if len(counts) > 1:
        raise CheckpointError(
            f"its parameters were stepped {sorted(counts)} times: a DeepSpeed param group steps "
            "all of them together; resume with the strategy it was written with"
        )
    return steps[0] if steps else None
