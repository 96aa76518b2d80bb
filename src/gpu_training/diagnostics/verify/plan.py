"""The run the checks of ``gpu-training verify`` share: its plan, its models, a check's result.

:class:`VerifyPlan` cuts one permutation of the dataset into the global batches every check
reads; :class:`VerifyModels` holds the model under test (DDP-wrapped when distributed), its
single-process reference and their optimizer, which the training checks advance one after
the other (:data:`~gpu_training.diagnostics.verify.report.CHECKS` order); each check returns
a :class:`CheckResult`. :func:`default_accumulate` is the toolkit's accumulation window and
:func:`unused_parameters` names the parameters that get no gradient.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, default_collate

from gpu_training.ddp import DistributedContext, gradient_sync, move_to_device, unwrap_model
from gpu_training.diagnostics.verify.ranks import gather_objects, wrap_ddp

__all__ = [
    "CheckResult",
    "VerifyModels",
    "VerifyPlan",
    "default_accumulate",
    "unused_parameters",
]

Batch = tuple[Any, Any]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
AccumulateFn = Callable[[nn.Module, Sequence[Batch], LossFn], None]


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict.

    Attributes:
        name: One of :data:`~gpu_training.diagnostics.verify.report.CHECKS`.
        passed: The verdict (identical on every rank).
        detail: The numbers behind it, one line.
    """

    name: str
    passed: bool
    detail: str


@dataclass
class VerifyPlan:
    """The run every check works on: the data, the loss, the batch layout, the tolerances.

    One permutation of the dataset (:attr:`order`, the same on every rank) is cut into global
    batches: global batch ``k`` is positions ``k*G .. (k+1)*G``, and rank ``r``'s micro-batch
    ``a`` of it is the ``(r * accum_steps + a)``-th slice of ``batch_size`` samples.

    Attributes:
        dataset: Map-style dataset of ``(inputs, targets)`` pairs, the same on every rank.
        loss_fn: ``loss_fn(model(inputs), targets)`` → the micro-batch mean loss.
        ctx: This process's context.
        device: Where the batches and models go.
        batch_size: Per-device micro-batch.
        accum_steps: Micro-batches per optimizer step in the accumulation check.
        rtol: Relative gradient tolerance (of the largest reference gradient magnitude).
        atol: Absolute gradient tolerance; also the tolerance for parameters across ranks.
        seed: Seed for model initialisation and the batch permutation.
        num_samples: ``len(dataset)``.
        order: The permutation, drawn from ``seed``.
    """

    dataset: Dataset[Any]
    loss_fn: LossFn
    ctx: DistributedContext
    device: torch.device
    batch_size: int
    accum_steps: int
    rtol: float
    atol: float
    seed: int
    num_samples: int = field(init=False)
    order: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.num_samples = len(self.dataset)  # type: ignore[arg-type]
        generator = torch.Generator().manual_seed(self.seed)
        self.order = torch.randperm(self.num_samples, generator=generator).tolist()

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self.batch_size * self.accum_steps * self.ctx.world_size

    @property
    def allowed_tail(self) -> int:
        """Samples a sampler may drop at the end of an epoch."""
        return max(self.global_batch, self.ctx.world_size)

    def describe(self) -> str:
        """One line for :attr:`~gpu_training.diagnostics.verify.report.VerifyReport.setup`."""
        ctx = self.ctx
        return (
            f"{ctx.world_size} rank(s){f' ({ctx.backend})' if ctx.backend else ''}, micro-batch "
            f"{self.batch_size} x {self.accum_steps} accumulation = global batch "
            f"{self.global_batch}, {self.device.type}, fp32, eval mode for the gradient checks"
        )

    def micro_batch(self, step: int, rank: int, index: int) -> Batch:
        """Rank ``rank``'s micro-batch ``index`` of global batch ``step``, collated, on device."""
        n = self.num_samples
        start = (step * self.global_batch + (rank * self.accum_steps + index) * self.batch_size) % n
        items = [self.dataset[self.order[(start + i) % n]] for i in range(self.batch_size)]
        inputs, targets = move_to_device(default_collate(items), self.device)
        return inputs, targets

    def window(self, step: int, rank: int) -> list[Batch]:
        """Rank ``rank``'s ``accum_steps`` micro-batches of global batch ``step``."""
        return [self.micro_batch(step, rank, a) for a in range(self.accum_steps)]


# --- the models the checks advance --------------------------------------------------------


def default_accumulate(model: nn.Module, micro_batches: Sequence[Batch], loss_fn: LossFn) -> None:
    """The toolkit's accumulation window: ``no_sync`` off the boundary, losses divided by
    the number of micro-batches (so the window's gradient is the mean over its samples).

    Args:
        model: The DDP-wrapped model.
        micro_batches: This rank's ``(inputs, targets)`` micro-batches of one optimizer step.
        loss_fn: Mean loss over a micro-batch.
    """
    steps = len(micro_batches)
    for i, (inputs, targets) in enumerate(micro_batches):
        with gradient_sync(model, enabled=i == steps - 1):
            (loss_fn(model(inputs), targets) / steps).backward()


def unused_parameters(
    model: nn.Module, batch: Batch, loss_fn: LossFn, ctx: DistributedContext
) -> list[str]:
    """Parameters that get no gradient from one forward and backward on ``batch``, any rank.

    A collective. DDP (without ``find_unused_parameters``) raises at the iteration after
    such a backward, naming parameter indices at best; this names them. The gradients are
    set back to None afterwards.

    Args:
        model: The unwrapped model, in the mode the checks run it.
        batch: This rank's ``(inputs, targets)``.
        loss_fn: The micro-batch mean loss.
        ctx: This process's context.

    Returns:
        The names, in ``named_parameters()`` order, of those unused on some rank.

    Example:
        >>> m = nn.ModuleDict({"used": nn.Linear(2, 1), "spare": nn.Linear(2, 1)})
        >>> m.forward = lambda x: m["used"](x)
        >>> loss = torch.nn.functional.mse_loss
        >>> unused_parameters(m, (torch.ones(3, 2), torch.ones(3, 1)), loss, DistributedContext())
        ['spare.weight', 'spare.bias']
    """
    model.zero_grad(set_to_none=True)
    loss_fn(model(batch[0]), batch[1]).backward()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    here = {n for n, p in named if p.grad is None}
    model.zero_grad(set_to_none=True)
    anywhere: set[str] = set().union(*gather_objects(sorted(here), ctx))
    return [n for n, _ in named if n in anywhere]


class _SyncCounter:
    """Counts DDP's gradient syncs: passes over its buckets, through a comm hook that reduces.

    Counts the *last* bucket of each pass, not buckets: DDP rebuilds its buckets after the
    first iteration (1 became 2 on the built-in task), so a bucket count is no unit.
    """

    def __init__(self) -> None:
        self.syncs = 0

    def hook(self) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counting_allreduce(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
            if bucket.is_last():  # one per backward that syncs, whatever the bucket layout
                self.syncs += 1
            return allreduce_hook(state, bucket)

        # DDP checks these annotations as objects; postponed (string) ones would fail its check.
        counting_allreduce.__annotations__ = {
            "state": object,
            "bucket": dist.GradBucket,  # type: ignore[attr-defined, unused-ignore]
            "return": torch.futures.Future[torch.Tensor],
        }
        return counting_allreduce


@dataclass
class VerifyModels:
    """The models the gradient and checkpoint checks share and advance, in the checks' order.

    Attributes:
        wrapped: The model under test: DDP-wrapped when distributed, else the bare model.
        reference: A single-process copy of it (never wrapped): the expected gradients.
        optimizer: AdamW on ``wrapped``'s parameters.
        counter: Counts the gradient syncs DDP runs.
        first: This rank's first micro-batch of global batch 0.
        ddp: Whether ``wrapped`` is DDP (then ``counter`` counts).
        unused: Parameters that got no gradient from a forward on any rank's ``first``; when
            there are some, DDP is built with ``find_unused_parameters=True`` so that the
            checks can run (the ``grad_sync`` check reports them).
    """

    wrapped: nn.Module
    reference: nn.Module
    optimizer: torch.optim.Optimizer
    counter: _SyncCounter
    first: Batch
    ddp: bool
    unused: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, model: nn.Module, plan: VerifyPlan) -> VerifyModels:
        """Wrap ``model`` (DDP broadcasts rank 0's weights), copy it, both in ``eval()`` mode.

        One forward and backward on ``first`` first finds the parameters that get no
        gradient (DDP would raise at its next iteration instead, naming none of them).

        Args:
            model: The freshly built model, on ``plan.device``.
            plan: The run.

        Returns:
            The models, with ``first`` read from the dataset.
        """
        first = plan.micro_batch(0, plan.ctx.rank, 0)
        model.eval()
        unused = unused_parameters(model, first, plan.loss_fn, plan.ctx)
        wrapped = wrap_ddp(model, plan.ctx, plan.device, find_unused_parameters=bool(unused))
        counter = _SyncCounter()
        if wrapped is not model:
            wrapped.register_comm_hook(state=None, hook=counter.hook())  # type: ignore[operator]
        reference = copy.deepcopy(unwrap_model(wrapped))
        wrapped.eval()
        reference.eval()
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
        return cls(
            wrapped, reference, optimizer, counter, first, ddp=wrapped is not model, unused=unused
        )
