"""How long a training run takes and what it costs, per strategy.

A step is the compute of its micro-batches plus the communication its strategy adds, minus
what overlaps with that compute::

    compute per micro-batch = micro_batch x tokens per sample x FLOPs per token / (peak x MFU)
                              (forward 1/3, backward 2/3; activation checkpointing adds a
                              forward to the backward)
    step = accumulation x compute per micro-batch + exposed communication

and the run is ``steps x step`` hours, ``x GPUs x price`` dollars. The communication is the
ZeRO paper's (arXiv:1910.02054, section 7) per strategy, timed as ring collectives that are
hierarchical across nodes (:func:`collective_seconds`):

========================  ===========================================  ======================
strategy                  per step                                     hidden under
========================  ===========================================  ======================
``ddp``                   all-reduce of the fp32 gradients             the last micro-batch's
                                                                       backward (``no_sync``
                                                                       before it)
``zero1``                 reduce-scatter of 16-bit gradients, then     backward (last
                          all-gather of the updated 16-bit weights     micro-batch); nothing
``zero2``                 the reduce-scatter on every micro-batch      each backward; nothing
``fsdp`` / ``zero3``      per micro-batch: all-gather of the weights   forward; backward
                          in forward and again in backward, reduce-
                          scatter of the gradients
``zero3_offload``         ``zero3``, plus the gradient shard to the    backward; nothing
                          CPU over PCIe and the updated weight shard
                          back after the step
========================  ===========================================  ======================

With ``TrainingRun.tensor_parallel = t`` the ``fsdp`` row is the 2-D layout (torchtitan's):
every GPU computes ``1/t`` of its group's micro-batch; per transformer block, attention and
MLP each move one all-reduce's worth of the ``b·s·h`` activations over the ``t`` GPUs of a
node (with sequence parallel: an all-gather and a reduce-scatter) in forward and twice that
in backward (Korthikanti et al. 2022, arXiv:2205.05198), on the critical path, not hidden;
FSDP gathers and reduces ``1/t`` of the parameters over the ``num_gpus / t`` data-parallel
groups, whose ring crosses nodes (:func:`tensor_parallel_seconds`).

What is left out is listed by :func:`assumptions`. The FLOPs per token come from
:meth:`~gpu_training.memory.TransformerShape.flops_per_token` (``6N + 12·L·H·Q·T``, the
formula :func:`gpu_training.throughput.flops_per_token` uses) and the GPUs from
:mod:`gpu_training.hardware`. No torch here.

Example:
    >>> from gpu_training.hardware import gpu_spec
    >>> run = TrainingRun(num_params=124_000_000, flops_per_token=855_000_000,
    ...                   tokens_per_sample=1024, micro_batch=16, accumulation=4, num_gpus=8)
    >>> step = step_time(run, gpu_spec("a100-80gb"), "ddp")
    >>> round(step.compute_s, 3), round(step.exposed_s, 3)
    (0.449, 0.0)
    >>> cost = run_cost(step, tokens=10**10, price_per_gpu_hour=1.2)
    >>> cost.steps, round(cost.hours, 2), round(cost.dollars, 2)
    (19074, 2.38, 22.84)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpu_training.config.checks import check_int_argument
from gpu_training.hardware import GPUSpec

if TYPE_CHECKING:
    from gpu_training.memory.budget import TransformerShape

__all__ = [
    "STRATEGIES",
    "RunCost",
    "StepTime",
    "TrainingRun",
    "assumptions",
    "collective_seconds",
    "compute_tokens_per_s",
    "peak_flops",
    "run_cost",
    "shape_flops_per_token",
    "step_time",
    "tensor_parallel_assumption",
    "tensor_parallel_seconds",
]

STRATEGIES: tuple[str, ...] = ("none", "ddp", "zero1", "zero2", "fsdp", "zero3", "zero3_offload")
"""The memory layouts (:data:`gpu_training.memory.LAYOUTS`) that :func:`step_time` times."""

_GB = 1e9  # bandwidths are GB/s: 10⁹ bytes per second
_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class TrainingRun:
    """What one optimizer step trains, and on how many GPUs.

    Example:
        >>> run = TrainingRun(num_params=7_000_000_000, flops_per_token=4.6e10,
        ...                   tokens_per_sample=4096, micro_batch=2, accumulation=8, num_gpus=16)
        >>> run.tokens_per_step, run.per_node, run.nodes
        (1048576, 8, 2)
    """

    num_params: int
    """Parameters: what FSDP and ZeRO-3 gather."""
    flops_per_token: float
    """Training FLOPs per token (``6N + 12·L·H·Q·T`` for a transformer)."""
    tokens_per_sample: int
    """Tokens in one sample (the sequence length; 1 for a model that is not a sequence model)."""
    micro_batch: int
    """Samples per GPU per forward/backward."""
    accumulation: int = 1
    """Micro-batches per optimizer step."""
    num_gpus: int = 1
    gpus_per_node: int = 0
    """GPUs per node (0: ``min(num_gpus, 8)``, as ``plan``'s launch command assumes)."""
    trainable_params: int | None = None
    """Parameters with gradients: what is reduced (default: all)."""
    precision: str = "bf16"
    """``bf16``/``fp16`` (16-bit copies are communicated) or ``fp32`` (TF32 matmuls)."""
    activation_checkpointing: bool = False
    """Recompute each block's forward in backward."""
    tensor_parallel: int = 1
    """GPUs of a node each layer is split over (``fsdp`` only; FSDP over the rest); then
    ``micro_batch`` is a data-parallel group's."""
    num_layers: int = 0
    """Transformer blocks (needed with ``tensor_parallel`` > 1)."""
    hidden_size: int = 0
    """Hidden size (needed with ``tensor_parallel`` > 1)."""

    def __post_init__(self) -> None:
        for name in ("num_params", "tokens_per_sample", "micro_batch", "accumulation", "num_gpus"):
            check_int_argument(name, getattr(self, name), 1)
        check_int_argument("gpus_per_node", self.gpus_per_node, 0)
        t = check_int_argument("tensor_parallel", self.tensor_parallel, 1)
        check_int_argument("num_layers", self.num_layers, 1 if t > 1 else 0)
        check_int_argument("hidden_size", self.hidden_size, 1 if t > 1 else 0)
        if t > 1 and (self.per_node % t or self.num_gpus % t):
            raise ValueError(
                f"tensor_parallel {t} must divide the GPUs per node ({self.per_node}) and the "
                f"GPUs ({self.num_gpus}): tensor parallelism stays inside a node"
            )
        if self.trainable_params is not None:
            check_int_argument("trainable_params", self.trainable_params, 0)
        fpt = self.flops_per_token
        if isinstance(fpt, bool) or not isinstance(fpt, (int, float)) or not 0 < fpt < math.inf:
            raise ValueError(f"flops_per_token must be a finite number > 0, got {fpt!r}")
        if self.precision not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"precision must be bf16, fp16 or fp32, got {self.precision!r}")

    @property
    def per_node(self) -> int:
        """GPUs per node, as used."""
        return min(self.gpus_per_node or 8, self.num_gpus)

    @property
    def nodes(self) -> int:
        """Nodes the GPUs span."""
        return math.ceil(self.num_gpus / self.per_node)

    @property
    def trainable(self) -> int:
        """Parameters with gradients."""
        return self.num_params if self.trainable_params is None else self.trainable_params

    @property
    def data_parallel(self) -> int:
        """Data-parallel groups: the GPUs over ``tensor_parallel``."""
        return self.num_gpus // self.tensor_parallel

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all GPUs."""
        return self.micro_batch * self.accumulation * self.data_parallel * self.tokens_per_sample


@dataclass(frozen=True)
class StepTime:
    """One optimizer step of one strategy, in seconds."""

    strategy: str
    compute_s: float
    """Forward and backward of every micro-batch (with recompute, if checkpointing)."""
    communication_s: float
    """Every collective and host transfer of the step, overlapped or not."""
    exposed_s: float
    """The part of the communication that no compute hides."""
    tokens_per_step: int
    num_gpus: int

    @property
    def step_s(self) -> float:
        """Seconds per optimizer step."""
        return self.compute_s + self.exposed_s

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second over all GPUs."""
        return self.tokens_per_step / self.step_s

    def mfu(self, flops_per_token: float, peak_tflops: float) -> float:
        """The MFU the whole step achieves (lower than the assumed one when comm is exposed)."""
        return self.tokens_per_s * flops_per_token / (self.num_gpus * peak_tflops * 1e12)


@dataclass(frozen=True)
class RunCost:
    """A whole run at one strategy's step time."""

    step: StepTime
    steps: int
    price_per_gpu_hour: float | None

    @property
    def tokens(self) -> int:
        """Tokens trained (whole steps: at least what was asked)."""
        return self.steps * self.step.tokens_per_step

    @property
    def hours(self) -> float:
        """Wall-clock hours."""
        return self.steps * self.step.step_s / 3600

    @property
    def gpu_hours(self) -> float:
        """GPU-hours: what is billed."""
        return self.hours * self.step.num_gpus

    @property
    def dollars(self) -> float | None:
        """Dollars at ``price_per_gpu_hour`` (None without a price)."""
        if self.price_per_gpu_hour is None:
            return None
        return self.gpu_hours * self.price_per_gpu_hour


def peak_flops(spec: GPUSpec, precision: str = "bf16") -> float:
    """The dense peak in FLOP/s that ``precision`` runs at on ``spec``.

    Example:
        >>> from gpu_training.hardware import gpu_spec
        >>> peak_flops(gpu_spec("a100-80gb")) / 1e12, peak_flops(gpu_spec("a100-80gb"), "fp32") / 1e12
        (312.0, 156.0)
    """
    # fp32 matmuls run on tensor cores as TF32 (set_float32_matmul_precision("high")): half
    # the bf16 rate on every GPU in the table.
    return spec.bf16_tflops * 1e12 / (2 if precision == "fp32" else 1)


def compute_tokens_per_s(
    flops_per_token: float,
    spec: GPUSpec,
    mfu: float | None = None,
    *,
    precision: str = "bf16",
    activation_checkpointing: bool = False,
) -> float:
    """Tokens per second one GPU computes, with no communication: peak x MFU / FLOPs per token.

    Example:
        >>> from gpu_training.hardware import gpu_spec
        >>> round(compute_tokens_per_s(4.6e10, gpu_spec("a100-80gb"), 0.4))
        2713
    """
    rate = peak_flops(spec, precision) * (spec.mfu if mfu is None else mfu) / flops_per_token
    # Checkpointing recomputes the forward (a third of 6N) in backward: 8N of work per 6N.
    return rate * 3 / 4 if activation_checkpointing else rate


def collective_seconds(
    kind: str, num_bytes: float, num_gpus: int, gpus_per_node: int, spec: GPUSpec
) -> float:
    """Seconds of one ring collective over ``num_bytes`` (the whole, unsharded tensor).

    Hierarchical across nodes, as NCCL runs it: within each node ``(g-1)/g x bytes`` at
    ``intra_node_gbps``, then between the ``m`` nodes ``(m-1)/m x bytes/g`` per GPU at
    ``inter_node_gbps``. An all-reduce is a reduce-scatter and an all-gather: twice that. On
    one node this is the ring's ``(N-1)/N x bytes`` (``2(N-1)/N`` for the all-reduce).

    Args:
        kind: ``all_gather``, ``reduce_scatter`` or ``all_reduce``.
        num_bytes: Bytes of the full tensor.
        num_gpus: GPUs in the collective.
        gpus_per_node: GPUs per node (``g``).
        spec: The GPU (its bandwidths).

    Example:
        >>> from gpu_training.hardware import gpu_spec
        >>> h100 = gpu_spec("h100")  # 450 GB/s NVLink, 50 GB/s per GPU between nodes
        >>> round(collective_seconds("all_reduce", 28e9, 8, 8, h100), 4)  # 2 x 7/8 x 28 GB / 450
        0.1089
        >>> round(collective_seconds("all_reduce", 28e9, 16, 8, h100), 4)  # + 2 x 1/2 x 3.5 GB / 50
        0.1789
    """
    if kind not in _COLLECTIVES:
        raise ValueError(f"kind must be one of {', '.join(_COLLECTIVES)}, got {kind!r}")
    g = min(gpus_per_node, num_gpus)
    m = math.ceil(num_gpus / g)
    one_way = (g - 1) / g * num_bytes / (spec.intra_node_gbps * _GB)
    one_way += (m - 1) / m * num_bytes / g / (spec.inter_node_gbps * _GB)
    return 2 * one_way if kind == "all_reduce" else one_way


def tensor_parallel_seconds(run: TrainingRun, spec: GPUSpec, backward: bool = False) -> float:
    """Seconds of one micro-batch's tensor-parallel collectives, forward or backward.

    Per block, attention and MLP each all-reduce (with sequence parallel: all-gather, then
    reduce-scatter) the ``micro_batch x tokens_per_sample x hidden_size`` activations in
    16-bit (fp32 in fp32) over the ``t`` GPUs of a node; backward moves twice forward.

    Example:
        >>> from gpu_training.hardware import gpu_spec
        >>> run = TrainingRun(num_params=70 * 10**9, flops_per_token=4.5e11,
        ...                   tokens_per_sample=4096, micro_batch=1, num_gpus=16,
        ...                   tensor_parallel=8, num_layers=80, hidden_size=8192)
        >>> # 80 x 2 x all-reduce(1 x 4096 x 8192 x 2 B over 8): 2 x 7/8 x 64 MiB / 450 GB/s
        >>> round(tensor_parallel_seconds(run, gpu_spec("h100")), 4)
        0.0418
    """
    t = run.tensor_parallel
    if t == 1:
        return 0.0
    width = 4 if run.precision == "fp32" else 2
    tensor = run.micro_batch * run.tokens_per_sample * run.hidden_size * width
    one = collective_seconds("all_reduce", tensor, t, t, spec)
    return run.num_layers * 2 * one * (2 if backward else 1)


def step_time(run: TrainingRun, spec: GPUSpec, strategy: str, mfu: float | None = None) -> StepTime:
    """One optimizer step of ``run`` under ``strategy`` on ``spec`` GPUs.

    Args:
        run: The model, batch and GPU count.
        spec: The GPU.
        strategy: One of :data:`STRATEGIES`.
        mfu: Model FLOPs utilisation (default: ``spec.mfu``).

    Returns:
        The compute, the communication and the part of it left exposed.

    Raises:
        ValueError: For an unknown strategy or an MFU outside (0, 1].
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    share = spec.mfu if mfu is None else mfu
    if not 0 < share <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {share!r}")
    t = run.tensor_parallel
    if t > 1 and strategy != "fsdp":
        raise ValueError(f"tensor_parallel {t} is timed with fsdp only, got {strategy!r}")
    tokens = run.micro_batch * run.tokens_per_sample
    # Under tensor parallel each GPU of the group computes 1/t of the group's micro-batch.
    micro = tokens * run.flops_per_token / (peak_flops(spec, run.precision) * share * t)
    forward = micro / 3  # 2N of the 6N FLOPs per token
    backward = 2 * micro / 3 + (forward if run.activation_checkpointing else 0.0)
    k = run.accumulation
    compute = k * (forward + backward)

    def coll(kind: str, num_bytes: float) -> float:
        # 2-D: FSDP's ring joins one GPU of each tensor-parallel group: per_node / t per node.
        dp, per_node = run.data_parallel, run.per_node // t
        return collective_seconds(kind, num_bytes, dp, per_node, spec) if dp > 1 else 0.0

    # bf16/fp16 runs communicate 16-bit weights (FSDP's param_dtype, DeepSpeed's model copy).
    w16 = 2 if run.precision in ("bf16", "fp16") else 4
    params, grads = run.num_params / t, run.trainable / t  # a TP group's FSDP shares 1/t
    total = exposed = 0.0
    if strategy == "ddp":
        # DDP reduces the gradients in the parameters' dtype: fp32 under autocast.
        reduce = coll("all_reduce", 4 * grads)
        total, exposed = reduce, max(0.0, reduce - backward)
    elif strategy in ("zero1", "zero2"):
        scatter = coll("reduce_scatter", w16 * grads)
        gather = coll("all_gather", w16 * params)  # after the step: nothing left to hide it
        # ZeRO-2 keeps only its gradient shard, so it reduces every micro-batch.
        reductions = k if strategy == "zero2" else 1
        total = reductions * scatter + gather
        exposed = reductions * max(0.0, scatter - backward) + gather
    elif strategy in ("fsdp", "zero3", "zero3_offload"):
        gather = coll("all_gather", w16 * params)  # prefetched: the next unit under this one
        # FSDP reduces in fp32 (the toolkit's MixedPrecisionPolicy); DeepSpeed in 16 bits.
        scatter = coll("reduce_scatter", (4 if strategy == "fsdp" else w16) * grads)
        to_host = from_host = 0.0
        if strategy == "zero3_offload":
            to_host = w16 * grads / run.num_gpus / (spec.pcie_gbps * _GB)
            from_host = w16 * params / run.num_gpus / (spec.pcie_gbps * _GB)
        # PCIe and NVLink/network are separate links: the slower of the two sets the pace.
        behind_backward = max(gather + scatter, to_host)
        total = k * (2 * gather + scatter + to_host) + from_host
        exposed = k * (max(0.0, gather - forward) + max(0.0, behind_backward - backward))
        exposed += from_host  # the updated weights come back after the CPU's step
    # Tensor parallel's collectives sit between a layer's matmuls: nothing hides them.
    tp = k * (tensor_parallel_seconds(run, spec) + tensor_parallel_seconds(run, spec, True))
    name = f"{strategy}+tp{t}" if t > 1 else strategy
    return StepTime(name, compute, total + tp, exposed + tp, run.tokens_per_step, run.num_gpus)


def run_cost(
    step: StepTime,
    *,
    tokens: int | None = None,
    steps: int | None = None,
    price_per_gpu_hour: float | None = None,
) -> RunCost:
    """The whole run: ``tokens`` (rounded up to whole steps) or ``steps``, exactly one.

    Raises:
        ValueError: Without exactly one of ``tokens`` and ``steps``, or with one below 1.
    """
    if (tokens is None) == (steps is None):
        raise ValueError("give exactly one of tokens and steps")
    if steps is None:
        assert tokens is not None  # checked above
        check_int_argument("tokens", tokens, 1)
        steps = math.ceil(tokens / step.tokens_per_step)
    check_int_argument("steps", steps, 1)
    return RunCost(step, steps, price_per_gpu_hour)


def shape_flops_per_token(shape: TransformerShape, num_params: int | None = None) -> int:
    """Training FLOPs per token of a transformer shape whose real size is ``num_params``.

    :meth:`~gpu_training.memory.TransformerShape.flops_per_token` with the parameters the
    shape does not account for (``--params`` differing from the shape's own count) counted as
    weights a token is multiplied by: 6 FLOPs per token each.

    Example:
        >>> from gpu_training.memory import TransformerShape
        >>> s = TransformerShape(num_layers=12, hidden_size=768, seq_len=1024)
        >>> shape_flops_per_token(s) == s.flops_per_token()
        True
        >>> shape_flops_per_token(s, s.num_params() + 1000) - s.flops_per_token()
        6000
    """
    base = shape.flops_per_token()
    if num_params is None:
        return base
    adjusted = base + 6 * (num_params - shape.num_params())
    return adjusted if adjusted > 0 else 6 * num_params


def assumptions(run: TrainingRun, spec: GPUSpec, mfu: float | None = None) -> list[str]:
    """The model's assumptions, one short line each, with this run's figures in them."""
    share = spec.mfu if mfu is None else mfu
    peak = peak_flops(spec, run.precision) / 1e12
    recompute = "; +1/3 (a second forward) with activation checkpointing"
    lines = [
        f"compute: {run.flops_per_token:.3g} FLOPs per token at MFU {share:.0%} of the dense "
        f"{peak:g} TFLOP/s peak{recompute if run.activation_checkpointing else ''}",
        f"links: {spec.intra_node_gbps:g} GB/s per GPU within a node, "
        f"{spec.inter_node_gbps:g} GB/s per GPU between nodes, {spec.pcie_gbps:g} GB/s to the "
        "host, each way; peak rates: NCCL reaches less, so comm is a lower bound",
        "collectives: rings, hierarchical over nodes ((g-1)/g x bytes in the node, then "
        "(m-1)/m x bytes/g between nodes); an all-reduce is twice that",
        "overlap: DDP's bucketed all-reduce hides under the last micro-batch's backward "
        "(no_sync before it); FSDP/ZeRO-3 prefetch hides the all-gathers under forward and "
        "backward, the reduce-scatter under backward; the weights' all-gather after a "
        "ZeRO-1/2 step and offload's upload hide under nothing",
        "not counted: the optimizer step (offload's CPU Adam can dominate), data loading, "
        "stragglers, launch and checkpoint time",
    ]
    if run.precision == "fp32":
        lines.append("fp32: matmuls as TF32 at half the bf16 peak")
    if run.tensor_parallel > 1:
        lines.append(tensor_parallel_assumption(run))
    return lines


def tensor_parallel_assumption(run: TrainingRun) -> str:
    """What the model assumes of a tensor-parallel ``run``, in one line."""
    t = run.tensor_parallel
    return (
        f"tensor parallel {t}: per block, attention and MLP each all-reduce the b x s x h "
        f"activations over {t} GPUs of a node (sequence parallel: all-gather + reduce-scatter) "
        "in forward, twice that in backward, none of it hidden; each GPU computes 1/"
        f"{t} of its group's micro-batch at the same MFU; FSDP moves 1/{t} of the parameters "
        f"over the {run.data_parallel} data-parallel groups"
    )
