"""The run the checks of ``gpu-training verify`` share: its plan, its models, a check's result.

:class:`VerifyPlan` cuts one permutation of the dataset into the global batches every check
reads; :class:`VerifyModels` holds the model under test (DDP-wrapped when distributed), its
single-process reference and their optimizer, which the training checks advance one after
the other (:data:`~gpu_training.diagnostics.verify.report.CHECKS` order); each check returns
a :class:`CheckResult`. :class:`LossKind` says how the Trainer normalizes the job's loss —
a mean per micro-batch, or ``(sum, count)`` over the scored targets of the whole global batch —
and :class:`StepLoss` applies it to one step's micro-batches, so that every check compares like
with like. :func:`default_accumulate` is the toolkit's accumulation window and
:func:`unused_parameters` names the parameters that get no gradient.

Example:
    >>> from gpu_training.tasks import count_scored, cross_entropy_sum
    >>> targets = torch.tensor([[1, 2, -100, -100], [3, -100, -100, -100]])
    >>> batches = [(torch.zeros(1, 4), targets[:1]), (torch.zeros(1, 4), targets[1:])]
    >>> kind = LossKind(cross_entropy_sum, count_scored, summed=True)
    >>> loss = kind.for_step(batches, DistributedContext())  # 3 scored targets in all
    >>> loss.scored, kind.describe()
    (3, '(sum, count), normalized over the scored targets of the whole batch (all ranks and micro-batches), as the Trainer does')
    >>> logits = torch.zeros(1, 4, 5)  # ln 5 = 1.6094 per scored target
    >>> [round(float(loss(logits, t)), 3) for _, t in batches]  # sums 2 ln 5 and ln 5, x A*W/3
    [2.146, 1.073]
    >>> round(sum(float(loss(logits, t)) for _, t in batches) / 2, 4)  # the window's 1/A
    1.6094
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
from gpu_training.step import LossOutput, global_count, global_scale, sum_and_count
from gpu_training.tasks import count_scored

__all__ = [
    "CheckResult",
    "LossKind",
    "StepLoss",
    "VerifyInputError",
    "VerifyModels",
    "VerifyPlan",
    "default_accumulate",
    "unused_parameters",
]

Batch = tuple[Any, Any]
LossFn = Callable[[Any, Any], torch.Tensor]
"""A loss as an accumulation window backpropagates it: a 0-d tensor per micro-batch."""
TaskLossFn = Callable[[Any, Any], LossOutput]
"""The job's loss: a 0-d micro-batch mean, or ``(sum over scored targets, their count)``."""
CountFn = Callable[[torch.Tensor], torch.Tensor]
"""Scored targets in a micro-batch's targets (the task's ``count_targets``)."""
AccumulateFn = Callable[[nn.Module, Sequence[Batch], LossFn], None]


class VerifyInputError(ValueError):
    """The verify setup cannot run: too few samples, a bad sampler, an unknown check, a loss
    whose counts are not the task's."""


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
        loss_fn: ``loss_fn(model(inputs), targets)`` → the micro-batch mean loss, or
            ``(sum over scored targets, their count)``.
        ctx: This process's context.
        device: Where the batches and models go.
        batch_size: Per-device micro-batch.
        accum_steps: Micro-batches per optimizer step in the accumulation check.
        rtol: Relative gradient tolerance (of the largest reference gradient magnitude).
        atol: Absolute gradient tolerance; also the tolerance for parameters across ranks.
        seed: Seed for model initialisation and the batch permutation.
        count_fn: Scored targets of a micro-batch, for a ``(sum, count)`` loss.
        num_samples: ``len(dataset)``.
        order: The permutation, drawn from ``seed``.
    """

    dataset: Dataset[Any]
    loss_fn: TaskLossFn
    ctx: DistributedContext
    device: torch.device
    batch_size: int
    accum_steps: int
    rtol: float
    atol: float
    seed: int
    count_fn: CountFn = count_scored
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


# --- the loss, normalized as the Trainer normalizes it ------------------------------------


@dataclass(frozen=True)
class StepLoss:
    """The loss of one optimizer step's micro-batches, as :func:`~gpu_training.step.train_step`
    normalizes it; a :data:`LossFn` (call it per micro-batch).

    For a ``(sum, count)`` loss each micro-batch's sum is scaled by ``A * W / scored``, so that
    after the window's ``1/A`` and DDP's mean over ``W`` ranks the gradient is the sum over the
    whole batch divided by its scored targets; a mean loss is returned as it is.

    Attributes:
        loss_fn: The job's loss.
        summed: Whether ``loss_fn`` returns ``(sum, count)``.
        scored: Scored targets of the whole batch, all ranks and micro-batches (``count_fn``'s);
            0 for a mean loss (not counted).
        micro_batches: This rank's micro-batches in the step (``A``).
        world_size: Ranks (``W``).
    """

    loss_fn: TaskLossFn
    summed: bool
    scored: int
    micro_batches: int
    world_size: int

    def __call__(self, outputs: Any, targets: Any) -> torch.Tensor:
        """One micro-batch's loss as a rank backpropagates it in the step."""
        output = self.loss_fn(outputs, targets)
        if not isinstance(output, tuple):
            return output  # a mean is used as it is
        total, _ = sum_and_count(output, targets)
        return total * global_scale(self.scored, self.micro_batches, self.world_size)

    def whole(self, outputs: Any, targets: Any) -> torch.Tensor:
        """The loss of the whole batch in one process (``outputs`` of its concatenation).

        A ``(sum, count)`` loss's sum over its own count; a mean loss as it is.
        """
        output = self.loss_fn(outputs, targets)
        if not isinstance(output, tuple):
            return output
        total, count = sum_and_count(output, targets)
        return total / max(float(count), 1.0)

    def batch(self, samples: int, suffix: str = "") -> str:
        """``"the 16-sample batch"`` + ``suffix``, with the scored targets of a ``(sum, count)``
        loss: ``"the 16-sample batch's (135 scored targets)"``."""
        scored = f" ({self.scored} scored targets)" if self.summed else ""
        return f"the {samples}-sample batch{suffix}{scored}"


@dataclass(frozen=True)
class LossKind:
    """The job's loss and how the Trainer normalizes it: a mean, or ``(sum, count)``.

    Attributes:
        loss_fn: ``loss_fn(model(inputs), targets)``: a 0-d mean, or ``(sum, count)``.
        count_fn: Scored targets of a micro-batch (the task's ``count_targets``).
        summed: Whether ``loss_fn`` returns ``(sum, count)``.
    """

    loss_fn: TaskLossFn
    count_fn: CountFn
    summed: bool

    @classmethod
    def probe(cls, model: nn.Module, batch: Batch, plan: VerifyPlan) -> LossKind:
        """The kind ``plan.loss_fn`` returns on ``batch``; a collective.

        Args:
            model: The unwrapped model, in the mode the checks run it.
            batch: This rank's ``(inputs, targets)``.
            plan: The run (its loss and ``count_fn``).

        Returns:
            The kind, the same on every rank.

        Raises:
            VerifyInputError: On every rank, if a rank's loss returns something else than a
                0-d tensor or a pair, the kinds differ across ranks, or a ``(sum, count)``
                loss counts other targets than ``count_fn`` (the Trainer refuses it too).
        """
        with torch.no_grad():
            output = plan.loss_fn(model(batch[0]), batch[1])
        summed = isinstance(output, tuple) and len(output) == 2
        problem = ""
        if summed:
            returned, counted = int(output[1]), int(plan.count_fn(batch[1]))
            if returned != counted:
                problem = (
                    f"the loss returned a count of {returned} scored targets where "
                    f"count_targets finds {counted}: a (sum, count) loss must count what the "
                    "task's count_targets counts (targets != -100 by default)"
                )
        elif not (isinstance(output, torch.Tensor) and output.numel() == 1):
            what = (
                f"a tensor of shape {tuple(output.shape)}"
                if isinstance(output, torch.Tensor)
                else f"a {type(output).__name__}"
            )
            problem = f"the loss returned {what}: expected a 0-d mean or a (sum, count) pair"
        views = gather_objects((summed, problem), plan.ctx)
        for rank, (_, found) in enumerate(views):
            if found:
                raise VerifyInputError(f"rank {rank}: {found}")
        if any(kind != summed for kind, _ in views):
            raise VerifyInputError(
                f"the loss returns (sum, count) on some ranks and a mean on others: "
                f"{[('(sum, count)' if kind else 'mean') for kind, _ in views]}"
            )
        return cls(plan.loss_fn, plan.count_fn, summed)

    def for_step(self, batches: Sequence[Batch], ctx: DistributedContext) -> StepLoss:
        """The loss of one step made of every rank's ``batches``; a collective.

        For a ``(sum, count)`` loss the ranks' scored targets are counted and summed (every
        rank calls it with its own micro-batches of the step, at the same point).

        Args:
            batches: This rank's micro-batches of the step.
            ctx: This process's context.

        Returns:
            The step's loss.
        """
        scored = int(global_count(batches, self.count_fn, ctx)) if self.summed else 0
        return StepLoss(self.loss_fn, self.summed, scored, len(batches), ctx.world_size)

    def describe(self) -> str:
        """One line for :attr:`~gpu_training.diagnostics.verify.report.VerifyReport.loss`."""
        if self.summed:
            return (
                "(sum, count), normalized over the scored targets of the whole batch (all "
                "ranks and micro-batches), as the Trainer does"
            )
        return "mean per micro-batch, averaged over micro-batches and ranks, as the Trainer does"


# --- the models the checks advance --------------------------------------------------------


def default_accumulate(model: nn.Module, micro_batches: Sequence[Batch], loss_fn: LossFn) -> None:
    """The toolkit's accumulation window: ``no_sync`` off the boundary, losses divided by
    the number of micro-batches (so the window's gradient is the whole batch's).

    Args:
        model: The DDP-wrapped model.
        micro_batches: This rank's ``(inputs, targets)`` micro-batches of one optimizer step.
        loss_fn: A micro-batch's loss as the step backpropagates it (a :class:`StepLoss`:
            the mean, or a ``(sum, count)`` loss's sum normalized over the whole batch).
    """
    steps = len(micro_batches)
    for i, (inputs, targets) in enumerate(micro_batches):
        with gradient_sync(model, enabled=i == steps - 1):
            (loss_fn(model(inputs), targets) / steps).backward()


def unused_parameters(
    model: nn.Module, batch: Batch, loss_fn: TaskLossFn, ctx: DistributedContext
) -> list[str]:
    """Parameters that get no gradient from one forward and backward on ``batch``, any rank.

    A collective. DDP (without ``find_unused_parameters``) raises at the iteration after
    such a backward, naming parameter indices at best; this names them. The gradients are
    set back to None afterwards.

    Args:
        model: The unwrapped model, in the mode the checks run it.
        batch: This rank's ``(inputs, targets)``.
        loss_fn: The micro-batch mean loss, or ``(sum, count)``.
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
    sum_and_count(loss_fn(model(batch[0]), batch[1]), batch[1])[0].backward()
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
        loss: The job's loss and how the checks normalize it, as the Trainer does.
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
    loss: LossKind
    ddp: bool
    unused: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, model: nn.Module, plan: VerifyPlan) -> VerifyModels:
        """Wrap ``model`` (DDP broadcasts rank 0's weights), copy it, both in ``eval()`` mode.

        A forward on ``first`` finds the loss's kind; a forward and backward finds the
        parameters that get no gradient (DDP would raise at its next iteration instead,
        naming none of them).

        Args:
            model: The freshly built model, on ``plan.device``.
            plan: The run.

        Returns:
            The models, with ``first`` read from the dataset.

        Raises:
            VerifyInputError: From :meth:`LossKind.probe`, on every rank.
        """
        first = plan.micro_batch(0, plan.ctx.rank, 0)
        model.eval()
        loss = LossKind.probe(model, first, plan)
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
            wrapped,
            reference,
            optimizer,
            counter,
            first,
            loss,
            ddp=wrapped is not model,
            unused=unused,
        )
