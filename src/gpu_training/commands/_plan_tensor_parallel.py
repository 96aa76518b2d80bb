"""``gpu-training plan``'s 2-D layout: FSDP across nodes, tensor parallel inside a node.

:func:`tensor_parallel_option` sizes ``strategy: {name: fsdp, tensor_parallel: t}`` for a
transformer shape, or a model with a plan (its own, or the job file's ``strategy.tp_plan``;
what the plan leaves whole counts ``t`` times: :mod:`~gpu_training.commands._plan_model_split`):
its memory per GPU (:meth:`~gpu_training.memory.MemoryProfile.estimate`
with ``tensor_parallel``), its batch (a data-parallel group's) and, with the hardware, its
step time (:func:`gpu_training.cost.step_time`). It is recommended when FSDP alone does not
fit without offload and it does, or when FSDP fits and the 2-D step is faster. ``t`` divides
the GPUs per node (its all-reduces need the node's links), the heads, the KV heads, the
hidden size and the MLP width (a model: the widths and heads its plan splits);
``--tensor-parallel t`` asks for one, and a ``t`` that cannot be (or a model without a plan)
is refused in one line. A model is not timed: its task gives FLOPs, not the layers that TP's
all-reduces are counted by. Private to :mod:`gpu_training.commands`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpu_training.commands._plan_cost import CostRequest
from gpu_training.commands._plan_recommend import BatchPlan, layout_of, plan_batch, preference
from gpu_training.commands._plan_subject import Subject

if TYPE_CHECKING:
    from gpu_training.cost import StepTime, TrainingRun
    from gpu_training.memory import MemoryEstimate, TransformerShape
    from gpu_training.strategy import StrategyChoice

__all__ = ["TensorParallelOption", "degrees", "tensor_parallel_option"]


@dataclass(frozen=True)
class TensorParallelOption:
    """The 2-D layout sized for the plan: its degree, batch, memory and time."""

    degree: int
    """GPUs of a node each layer is split over."""
    data_parallel: int
    """Groups FSDP shards over (``--gpus / degree``)."""
    checkpointing: bool
    batch: BatchPlan
    """A data-parallel group's batch (its ``degree`` GPUs share each sample)."""
    estimate: MemoryEstimate
    """Memory per GPU at :attr:`batch`'s per-device batch."""
    fits: bool
    """At the decision batch (``--micro-batch`` or 1), as the 1-D choice is decided."""
    run: TrainingRun | None
    """What the time model prices (None without the hardware)."""
    step: StepTime | None
    """The step at :attr:`batch` (None without the hardware)."""
    recommended: bool
    reason: str

    @property
    def name(self) -> str:
        """The memory and time tables' row: ``fsdp+tp8``."""
        return f"fsdp+tp{self.degree}"


def _constraints(shape: TransformerShape, per_node: int, gpus: int) -> dict[str, int]:
    return {
        "GPUs per node": per_node,
        "GPUs": gpus,
        "attention heads": shape.heads,
        "KV heads": shape.kv_heads,
        "hidden size": shape.hidden_size,
        "MLP width": shape.ffn,
    }


def degrees(shape: TransformerShape, per_node: int, gpus: int) -> list[int]:
    """Every tensor-parallel degree above 1 the shape and the nodes allow, smallest first.

    Example:
        >>> from gpu_training.memory import TransformerShape
        >>> degrees(TransformerShape(80, 8192, 4096, num_heads=64, num_kv_heads=8), 8, 16)
        [2, 4, 8]
        >>> degrees(TransformerShape(48, 1600, 1024, num_heads=25), 8, 8)
        []
    """
    limits = _constraints(shape, per_node, gpus).values()
    return [t for t in range(2, per_node + 1) if all(v % t == 0 for v in limits)]


def _model_degrees(subject: Subject, per_node: int, gpus: int) -> list[int]:
    """The degrees a model's plan takes (its widths and heads), inside a node."""
    split = subject.split
    if split is None or split.missing:
        return []
    fits = [t for t in range(2, per_node + 1) if per_node % t == 0 and gpus % t == 0]
    return [t for t in fits if split.refusal(t) is None]


def _check_requested(t: int, subject: Subject, per_node: int, gpus: int) -> None:
    from gpu_training.cli import UsageError

    shape, split = subject.shape, subject.split
    if shape is None and split is None:
        raise UsageError(
            f"plan: --tensor-parallel {t}: the layers to split are known for a transformer "
            "shape (--layers/--hidden, with --heads, --kv-heads, --ffn as known) or a model "
            "with a tensor-parallel plan"
        )
    if split is not None and split.missing:
        raise UsageError(f"plan: --tensor-parallel {t}: {split.missing}")
    if per_node % t:
        raise UsageError(
            f"plan: --tensor-parallel {t}: tensor parallelism never spans nodes (its "
            f"all-reduces need the node's links): it must divide the GPUs per node ({per_node})"
        )
    if shape is None:
        assert split is not None  # refused above otherwise
        if gpus % t:
            raise UsageError(f"plan: --tensor-parallel {t}: it must divide the GPUs ({gpus})")
        refusal = split.refusal(t)
        if refusal is not None:
            raise UsageError(f"plan: --tensor-parallel {t}: {refusal}")
        return
    for what, value in _constraints(shape, per_node, gpus).items():
        if value % t:
            raise UsageError(f"plan: --tensor-parallel {t}: it must divide the {what} ({value})")


def _whole_state(estimate: MemoryEstimate, share: float, t: int) -> MemoryEstimate:
    """``estimate`` with the state a plan leaves whole on each of the ``t`` GPUs of a group.

    The estimate shards all state over every GPU; what the plan does not split (``1 - share``
    of it) FSDP shards over the data-parallel groups only: ``t`` times as much per GPU. The
    peak grows by as much (an upper bound: the optimizer step holds all of it at once).
    """
    import dataclasses

    scale = share + (1 - share) * t
    state = (estimate.parameters, estimate.gradients, estimate.optimizer_state)
    w, g, o = (round(x * scale) for x in state)
    grown = w + g + o - estimate.model_state
    peak = None if estimate.peak is None else estimate.peak + grown
    note = (
        f"the plan splits {share:.0%} of the parameters; the rest stay whole on each of the "
        f"{t} GPUs of a group, sharded over the data-parallel groups only"
    )
    return dataclasses.replace(
        estimate,
        parameters=w,
        gradients=g,
        optimizer_state=o,
        peak=peak,
        notes=(*estimate.notes, note),
    )


def tensor_parallel_option(
    subject: Subject,
    args: argparse.Namespace,
    choice: StrategyChoice,
    checkpointing: bool,
    batch: BatchPlan,
    cost: CostRequest | None,
) -> TensorParallelOption | None:
    """The 2-D layout to show beside the 1-D ``choice`` (at ``batch``), or None.

    None when the plan has nothing to say about it: ``--tensor-parallel 1``, a model without
    a plan, no degree the shape (or plan) and nodes allow, or a 1-D choice that fits without
    offload and is not slower (or there is no hardware or shape to time the two).

    Raises:
        UsageError: ``--tensor-parallel t`` that cannot be (named in one line).
    """
    from gpu_training.memory import format_bytes

    n, requested = args.gpus, args.tensor_parallel
    per_node = args.gpus_per_node or min(n, 8)
    if requested is not None:
        if requested == 1:
            return None
        _check_requested(requested, subject, per_node, n)
    if requested is not None:
        allowed = [requested]
    elif subject.shape is not None:
        allowed = degrees(subject.shape, per_node, n)
    else:
        allowed = _model_degrees(subject, per_node, n)
    one_d_fits = preference(choice) <= 1  # none, DDP or FSDP, fitting: no offload
    # A model is timed by its task's FLOPs, not a shape's layers: no 2-D time to compare.
    timed = cost is not None and subject.shape is not None
    if not allowed or (requested is None and one_d_fits and not timed):
        return None
    share = 1.0 if subject.split is None else subject.split.share
    probe = args.micro_batch or 1
    modes = (False, True) if subject.profile.checkpoint_samples is not None else (False,)

    def estimate(t: int, ckpt: bool, micro: int) -> MemoryEstimate:
        flat = subject.profile.estimate(
            micro,
            strategy="fsdp",
            world_size=n,
            activation_checkpointing=ckpt,
            overhead_bytes=args.overhead,
            tensor_parallel=t,
        )
        return flat if share >= 1.0 else _whole_state(flat, share, t)

    # Least tensor parallel first, then without checkpointing (as the 1-D tree prefers).
    tried = [(t, ckpt) for t in allowed for ckpt in modes]
    fitting = [(t, c) for t, c in tried if estimate(t, c, probe).total <= args.gpu_memory]
    sized = []
    for t, ckpt in fitting or [tried[-1] if requested is None else (requested, modes[-1])]:
        plan = plan_batch(subject, args, "fsdp", ckpt, tensor_parallel=t)
        sized.append((t, ckpt, plan, _step(subject, args, cost, t, ckpt, plan)))
    if cost is not None and fitting:  # the fastest that fits
        t, ckpt, plan, step = max(sized, key=lambda s: s[3].tokens_per_s if s[3] else 0.0)
    else:
        t, ckpt, plan, step = sized[0]
    fits = bool(fitting)
    at = estimate(t, ckpt, plan.micro)
    one_d = _step(subject, args, cost, 1, checkpointing, batch, layout_of(choice))
    usable = args.gpu_memory - args.overhead
    fmt = format_bytes
    head = (
        f"FSDP + tensor parallel {t} (TP inside each node, FSDP over {n // t} data-parallel "
        f"group{'s' if n // t > 1 else ''}; {fmt(estimate(t, ckpt, probe).allocated)} per GPU"
        f"{' with' if ckpt else ' without'} activation checkpointing)"
    )
    if requested is not None:
        recommended, why = True, f"{head}, as asked"
        if not fits:
            why += f": does NOT fit in {fmt(usable)}"
    elif not fits:
        recommended, why = False, f"{head}: does not fit in {fmt(usable)} either"
    elif not one_d_fits:
        recommended = True
        why = (
            f"FSDP alone over {n} GPUs does not fit without offloading the optimizer "
            f"({fmt(choice.per_gpu_bytes.get('fsdp', 0))} per GPU > {fmt(usable)}). {head} "
            f"fits without offload: the state is sharded {n} ways as FSDP's, and tensor + "
            f"sequence parallel split each sample's activations {t} ways"
        )
    else:
        assert step is not None and one_d is not None  # one_d_fits without cost returned above
        if step.tokens_per_s <= one_d.tokens_per_s:
            return None  # the 1-D plan fits and is faster: nothing to add to it
        recommended = True
        why = (
            f"{head} fits and steps faster than {one_d.strategy} alone: "
            f"{step.tokens_per_s:,.0f} vs {one_d.tokens_per_s:,.0f} tokens/s"
        )
    run = _run(subject, args, cost, t, ckpt, plan)
    return TensorParallelOption(t, n // t, ckpt, plan, at, fits, run, step, recommended, why)


def _step(
    subject: Subject,
    args: argparse.Namespace,
    cost: CostRequest | None,
    t: int,
    checkpointing: bool,
    batch: BatchPlan,
    strategy: str = "fsdp",
) -> StepTime | None:
    """The step time of ``strategy`` (``fsdp`` with tensor parallel ``t``) at ``batch``."""
    from gpu_training.cost import step_time

    run = _run(subject, args, cost, t, checkpointing, batch)
    return None if run is None or cost is None else step_time(run, cost.spec, strategy)


def _run(
    subject: Subject,
    args: argparse.Namespace,
    cost: CostRequest | None,
    t: int,
    checkpointing: bool,
    batch: BatchPlan,
) -> TrainingRun | None:
    from gpu_training.cost import TrainingRun

    shape = subject.shape
    if cost is None or shape is None or subject.flops_per_token is None:
        return None
    return TrainingRun(
        num_params=subject.profile.num_params,
        trainable_params=subject.profile.trainable_params,
        flops_per_token=subject.flops_per_token,
        tokens_per_sample=shape.seq_len,
        micro_batch=batch.micro,
        accumulation=batch.accumulation,
        num_gpus=args.gpus,
        gpus_per_node=args.gpus_per_node or 0,
        precision=subject.profile.precision,
        activation_checkpointing=checkpointing,
        tensor_parallel=t,
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
    )
