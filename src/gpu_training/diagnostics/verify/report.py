"""``gpu-training verify``: prove on your own model that data-parallel training is right.

Run on N ranks (gloo on CPUs, NCCL on GPUs) against a user's model, data and loss, each check
passes or fails with the numbers behind the verdict:

* ``sampler`` — the ranks' shards are disjoint and complete, every rank gets as many samples,
  and the order changes at the next epoch;
* ``data`` — every rank reads the same samples from the dataset (a dataset built differently
  per rank is a data bug, told apart from the gradient checks' verdicts);
* ``init`` — every rank builds the same parameters and buffers from the same seed (DDP
  broadcasts rank 0's and hides a difference; FSDP and DeepSpeed do not);
* ``grad_sync`` — every parameter gets a gradient (DDP raises on one that does not), and the
  gradient after DDP's all-reduce equals the single-process gradient on the concatenation of
  the batches the ranks drew, within ``atol + rtol * max|g|``;
* ``params_after_step`` — after one optimizer step (forward in ``train()`` mode) the
  parameters are identical on all ranks;
* ``accumulation`` — an accumulation window (the toolkit's ``no_sync`` loop, or the user's
  own ``step`` function) gives the big batch's gradient and all-reduces once, not once per
  micro-batch (counted by a comm hook, one per pass over DDP's buckets, however many);
* ``checkpoint`` — save, load into a fresh model and optimizer: the next step's loss and
  weights are bitwise those of the uninterrupted run.

The gradient checks run the model in ``eval()`` mode: dropout would draw different masks for
the split and the concatenated batch, and batch-norm statistics of a shard are not those of
the whole batch (SyncBatchNorm's business, not DDP's). They normalize the loss as the Trainer
does (:class:`~gpu_training.diagnostics.verify.plan.LossKind`): a loss returning
``(sum, count)`` — masked targets, e.g. instruction data's prompts — is divided by the scored
targets of the whole batch across ranks and micro-batches, on both sides of the comparison;
a mean loss is the mean of each micro-batch on the ranks and of the concatenation in one
process (so a mean over masked targets, whose gradient depends on the split, fails). The
report's :attr:`VerifyReport.loss` says which. The checkpoint round-trip is
:class:`~gpu_training.checkpoint.CheckpointManager` with
:func:`~gpu_training.resume.capture_training_state`, as the Trainer does it.

:func:`verify_setup` runs the checks inside an initialised process group (every rank calls
it); :func:`~gpu_training.diagnostics.verify.launch.run_verify` starts ``torchrun`` for
you; :func:`assert_grads_in_sync` is the one check to drop into a training loop. This module
holds those entry points and the report; each check is a function of
:mod:`~gpu_training.diagnostics.verify.checks` (those that train nothing) or
:mod:`~gpu_training.diagnostics.verify.training_checks`, on the run they share
(:mod:`~gpu_training.diagnostics.verify.plan`).

Example:
    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> from gpu_training.ddp import DistributedContext
    >>> data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    >>> report = verify_setup(lambda: torch.nn.Linear(4, 1), data,
    ...                       torch.nn.functional.mse_loss, DistributedContext())
    >>> report.passed, [c.name for c in report.checks][:3]
    (True, ['sampler', 'data', 'init'])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from gpu_training.ddp import DistributedContext, unwrap_model
from gpu_training.diagnostics.verify.checks import check_data, check_init, check_sampler
from gpu_training.diagnostics.verify.plan import (
    AccumulateFn,
    CheckResult,
    CountFn,
    TaskLossFn,
    VerifyInputError,
    VerifyModels,
    VerifyPlan,
    default_accumulate,
)
from gpu_training.diagnostics.verify.ranks import diff_from_rank0, is_distributed
from gpu_training.diagnostics.verify.training_checks import (
    check_accumulation,
    check_checkpoint,
    check_grad_sync,
    check_params_after_step,
)
from gpu_training.process_group import collective_device
from gpu_training.tasks import count_scored

__all__ = [
    "CHECKS",
    "GradientSyncError",
    "VerifyInputError",
    "VerifyReport",
    "assert_grads_in_sync",
    "verify_setup",
]

CHECKS: tuple[str, ...] = (
    "sampler",
    "data",
    "init",
    "grad_sync",
    "params_after_step",
    "accumulation",
    "checkpoint",
)
"""The checks, in the order they run."""

SamplerFn = Callable[[Dataset[Any], DistributedContext], Any]


class GradientSyncError(AssertionError):
    """Gradients (or parameters) differ between ranks; the message names them."""


@dataclass
class VerifyReport:
    """Every check's result and what was verified.

    Attributes:
        checks: The results, in :data:`CHECKS` order.
        world_size: Ranks that took part.
        backend: The process-group backend (None in one process).
        setup: One line describing the run (batch, precision, tolerance).
        loss: What the gradient checks compared: the loss's kind and normalization
            (:meth:`~gpu_training.diagnostics.verify.plan.LossKind.describe`).
    """

    checks: list[CheckResult] = field(default_factory=list)
    world_size: int = 1
    backend: str | None = None
    setup: str = ""
    loss: str = ""

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(c.passed for c in self.checks)

    def __getitem__(self, name: str) -> CheckResult:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def format(self) -> str:
        """The report as ``gpu-training verify`` prints it: ``PASS``/``FAIL`` per check."""
        lines = [f"verify: {self.setup}"] if self.setup else []
        if self.loss:
            lines.append(f"loss: {self.loss}")
        width = max((len(c.name) for c in self.checks), default=0)
        for check in self.checks:
            verdict = "PASS" if check.passed else "FAIL"
            lines.append(f"{verdict}  {check.name:<{width}}  {check.detail}")
        failed = [c.name for c in self.checks if not c.passed]
        total = len(self.checks)
        if failed:
            lines.append(
                f"{total - len(failed)} of {total} checks passed; failed: {', '.join(failed)}"
            )
        else:
            lines.append(f"all {total} checks passed")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``passed`` included)."""
        return {**asdict(self), "passed": self.passed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VerifyReport:
        """The inverse of :meth:`to_dict`."""
        checks = [CheckResult(**c) for c in data["checks"]]
        return cls(
            checks,
            int(data["world_size"]),
            data.get("backend"),
            data.get("setup", ""),
            data.get("loss", ""),
        )


def assert_grads_in_sync(
    model: nn.Module, ctx: DistributedContext, *, atol: float = 0.0, rtol: float = 0.0
) -> None:
    """Raise on every rank if any parameter's gradient differs from rank 0's.

    A collective: call it on every rank at the same point (after ``backward()`` and before
    ``optimizer.step()``), e.g. every N steps while debugging. DDP's all-reduce leaves the
    same gradient on every rank; a difference means some parameters are not synchronised
    (a wrapper bypassed, a module outside DDP, a hook changing gradients per rank).

    Args:
        model: The (wrapped or bare) model.
        ctx: This process's context; in one process the call returns at once.
        atol: Allowed absolute difference.
        rtol: Allowed difference relative to the largest gradient magnitude.

    Raises:
        GradientSyncError: Naming the parameter, the rank and the difference.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> assert_grads_in_sync(model, DistributedContext())  # one process: nothing to compare
    """
    named = [(name, p.grad) for name, p in unwrap_model(model).named_parameters()]
    results = diff_from_rank0(named, ctx)
    scale = max((float(g.detach().abs().max()) for _, g in named if g is not None), default=0.0)
    allowed = atol + rtol * scale
    bad = [(rank, diff, name) for rank, (diff, name) in enumerate(results) if not diff <= allowed]
    if bad:
        rank, diff, name = max(bad, key=lambda item: item[1])
        raise GradientSyncError(
            f"gradients out of sync: '{name}' on rank {rank} differs from rank 0 by {diff:.3g} "
            f"(allowed {allowed:.3g}); ranks out of sync: {[r for r, _, _ in bad]}"
        )


# --- the checks, in order -----------------------------------------------------------------


def verify_setup(
    build_model: Callable[[], nn.Module],
    dataset: Dataset[Any],
    loss_fn: TaskLossFn,
    ctx: DistributedContext,
    *,
    count_fn: CountFn | None = None,
    batch_size: int = 4,
    accum_steps: int = 2,
    make_sampler: SamplerFn | None = None,
    accumulate: AccumulateFn | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    seed: int = 0,
    device: torch.device | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
) -> VerifyReport:
    """Run every check on this rank; a collective (every rank calls it, same arguments).

    Args:
        build_model: Returns a fresh model (called after ``torch.manual_seed(seed)``).
        dataset: Map-style dataset of ``(inputs, targets)`` pairs, the same on every rank.
        loss_fn: ``loss_fn(model(inputs), targets)`` → the micro-batch mean loss, or
            ``(sum over scored targets, their count)`` (a task's ``loss_sum``), which the
            checks normalize over the whole batch's scored targets, as the Trainer does.
        ctx: This process's context (the process group is initialised when distributed).
        count_fn: Scored targets of a micro-batch, for a ``(sum, count)`` loss (a task's
            ``count_targets``; default :func:`~gpu_training.tasks.count_scored`, targets
            that are not -100).
        batch_size: Per-device micro-batch.
        accum_steps: Micro-batches per optimizer step in the accumulation check.
        make_sampler: ``make_sampler(dataset, ctx)`` → the training sampler (an index sampler
            or a batch sampler); default: the Trainer's
            :class:`~gpu_training.data.GlobalBatchSampler`.
        accumulate: ``accumulate(model, micro_batches, loss_fn)`` runs one accumulation
            window's forward and backward passes (the user's own loop; ``loss_fn`` returns
            each micro-batch's loss as the Trainer backpropagates it); default
            :func:`default_accumulate`.
        rtol: Relative gradient tolerance (of the largest reference gradient magnitude).
        atol: Absolute gradient tolerance; also the tolerance for parameters across ranks.
        seed: Seed for model initialisation and the batch permutation.
        device: Where to run (default: the first parameter's device after building, i.e.
            the CPU, moved to ``cuda:<local_rank>`` when the backend is NCCL).
        checkpoint_dir: A shared directory for the round-trip (default: a temporary one,
            removed afterwards).

    Returns:
        The report, identical on every rank.

    Raises:
        VerifyInputError: If the dataset is smaller than one global batch, a batch size is
            not positive, or the loss returns neither a mean nor ``(sum, count)`` with the
            counts of ``count_fn``.
    """
    plan = _plan(dataset, loss_fn, ctx, batch_size, accum_steps, rtol, atol, seed, device, count_fn)
    report = VerifyReport(world_size=ctx.world_size, backend=ctx.backend, setup=plan.describe())
    sampler_fn = make_sampler if make_sampler is not None else _global_batch_sampler(plan)
    sampler = sampler_fn(dataset, ctx)
    report.checks.append(check_sampler(sampler, plan.num_samples, ctx, plan.allowed_tail))
    report.checks.append(check_data(plan))

    torch.manual_seed(seed)
    model = build_model().to(plan.device)
    report.checks.append(check_init(model, ctx))

    models = VerifyModels.build(model, plan)
    report.loss = models.loss.describe()
    report.checks.append(check_grad_sync(plan, models))
    report.checks.append(check_params_after_step(plan, models))
    report.checks.append(check_accumulation(plan, models, accumulate or default_accumulate))
    report.checks.append(check_checkpoint(plan, models, build_model, checkpoint_dir))
    del models, model  # free DDP's reducer before the group goes
    return report


def _plan(
    dataset: Dataset[Any],
    loss_fn: TaskLossFn,
    ctx: DistributedContext,
    batch_size: int,
    accum_steps: int,
    rtol: float,
    atol: float,
    seed: int,
    device: torch.device | None,
    count_fn: CountFn | None,
) -> VerifyPlan:
    """:func:`verify_setup`'s arguments checked, with the default device filled in."""
    if batch_size < 1 or accum_steps < 1:
        raise VerifyInputError(
            f"batch_size and accum_steps must be >= 1, got {batch_size} and {accum_steps}"
        )
    world = ctx.world_size
    global_batch = batch_size * accum_steps * world
    num_samples = len(dataset)  # type: ignore[arg-type]
    if num_samples < global_batch:
        raise VerifyInputError(
            f"the dataset has {num_samples} samples; verify needs one global batch of "
            f"{world} ranks x {accum_steps} micro-steps x {batch_size} = {global_batch}: "
            "lower --batch-size or --accum"
        )
    if device is None:
        device = collective_device() if is_distributed(ctx) else torch.device("cpu")
    return VerifyPlan(
        dataset,
        loss_fn,
        ctx,
        device,
        batch_size,
        accum_steps,
        rtol,
        atol,
        seed,
        count_fn=count_fn or count_scored,
    )


def _global_batch_sampler(plan: VerifyPlan) -> SamplerFn:
    """The default ``make_sampler``: the Trainer's sampler over ``plan``'s global batches."""
    from gpu_training.data import GlobalBatchSampler

    def make_sampler(data: Dataset[Any], c: DistributedContext) -> Any:
        return GlobalBatchSampler(
            plan.num_samples, plan.global_batch, plan.batch_size, c, seed=plan.seed
        )

    return make_sampler
