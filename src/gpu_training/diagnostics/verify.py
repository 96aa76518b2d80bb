"""``gpu-training verify``: prove on your own model that data-parallel training is right.

Run on N ranks (gloo on CPUs, NCCL on GPUs) against a user's model, data and loss, each check
passes or fails with the numbers behind the verdict:

* ``sampler`` — the ranks' shards are disjoint and complete, every rank gets as many samples,
  and the order changes at the next epoch;
* ``init`` — every rank builds the same parameters from the same seed;
* ``grad_sync`` — the gradient after DDP's all-reduce equals the single-process gradient on the
  concatenated batch, within ``atol + rtol * max|g|``;
* ``params_after_step`` — after one optimizer step (forward in ``train()`` mode) the
  parameters are identical on all ranks;
* ``accumulation`` — an accumulation window (the toolkit's ``no_sync`` loop, or the user's
  own ``step`` function) gives the big batch's gradient and all-reduces once, not once per
  micro-batch;
* ``checkpoint`` — save, load into a fresh model and optimizer: the next step's loss and
  weights are bitwise those of the uninterrupted run.

The gradient checks run the model in ``eval()`` mode: dropout would draw different masks for
the split and the concatenated batch, and batch-norm statistics of a shard are not those of
the whole batch (SyncBatchNorm's business, not DDP's). The checkpoint round-trip is
:class:`~gpu_training.checkpoint.CheckpointManager` with
:func:`~gpu_training.resume.capture_training_state`, as the Trainer does it.

:func:`verify_setup` runs the checks inside an initialised process group (every rank calls
it); :func:`~gpu_training.diagnostics.verify_launch.run_verify` starts ``torchrun`` for you;
:func:`assert_grads_in_sync` is the one check to drop into a training loop.

Example:
    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> from gpu_training.ddp import DistributedContext
    >>> data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    >>> report = verify_setup(lambda: torch.nn.Linear(4, 1), data,
    ...                       torch.nn.functional.mse_loss, DistributedContext())
    >>> report.passed, [c.name for c in report.checks][:3]
    (True, ['sampler', 'init', 'grad_sync'])
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, default_collate

from gpu_training.ddp import DistributedContext, gradient_sync, move_to_device, unwrap_model

__all__ = [
    "CHECKS",
    "CheckResult",
    "GradientSyncError",
    "VerifyInputError",
    "VerifyReport",
    "assert_grads_in_sync",
    "default_accumulate",
    "verify_setup",
]

CHECKS: tuple[str, ...] = (
    "sampler",
    "init",
    "grad_sync",
    "params_after_step",
    "accumulation",
    "checkpoint",
)
"""The checks, in the order they run."""

Batch = tuple[Any, Any]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
AccumulateFn = Callable[[nn.Module, Sequence[Batch], LossFn], None]
SamplerFn = Callable[[Dataset[Any], DistributedContext], Any]


class GradientSyncError(AssertionError):
    """Gradients (or parameters) differ between ranks; the message names them."""


class VerifyInputError(ValueError):
    """The verify setup cannot run: too few samples, a bad sampler, an unknown check."""


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict.

    Attributes:
        name: One of :data:`CHECKS`.
        passed: The verdict (identical on every rank).
        detail: The numbers behind it, one line.
    """

    name: str
    passed: bool
    detail: str


@dataclass
class VerifyReport:
    """Every check's result and what was verified.

    Attributes:
        checks: The results, in :data:`CHECKS` order.
        world_size: Ranks that took part.
        backend: The process-group backend (None in one process).
        setup: One line describing the run (batch, precision, tolerance).
    """

    checks: list[CheckResult] = field(default_factory=list)
    world_size: int = 1
    backend: str | None = None
    setup: str = ""

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
        return cls(checks, int(data["world_size"]), data.get("backend"), data.get("setup", ""))


# --- cross-rank comparisons ---------------------------------------------------------------


def _distributed(ctx: DistributedContext) -> bool:
    return ctx.is_distributed and dist.is_available() and dist.is_initialized()


def _gather(obj: Any, ctx: DistributedContext) -> list[Any]:
    """Every rank's ``obj``, indexed by rank (``[obj]`` in one process)."""
    if not _distributed(ctx):
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def _diff_from_rank0(
    named: Sequence[tuple[str, torch.Tensor | None]], ctx: DistributedContext
) -> list[tuple[float, str]]:
    """Per rank: the largest ``|t - t_rank0|`` over ``named`` and the name where it is.

    The shapes are compared first (a tensor missing, None or shaped differently on a rank is
    an infinite difference there); then one broadcast of rank 0's flattened tensors.
    """
    layout = [(name, None if t is None else tuple(t.shape)) for name, t in named]
    layouts = _gather(layout, ctx)
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
    if not tensors or not _distributed(ctx):
        return [(0.0, "")] * ctx.world_size if _distributed(ctx) else [(0.0, "")]
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
    return _gather((worst, where), ctx)


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
    results = _diff_from_rank0(named, ctx)
    scale = max((float(g.detach().abs().max()) for _, g in named if g is not None), default=0.0)
    allowed = atol + rtol * scale
    bad = [(rank, diff, name) for rank, (diff, name) in enumerate(results) if not diff <= allowed]
    if bad:
        rank, diff, name = max(bad, key=lambda item: item[1])
        raise GradientSyncError(
            f"gradients out of sync: '{name}' on rank {rank} differs from rank 0 by {diff:.3g} "
            f"(allowed {allowed:.3g}); ranks out of sync: {[r for r, _, _ in bad]}"
        )


# --- data -----------------------------------------------------------------------------------


def _indices(sampler: Any) -> list[int]:
    out: list[int] = []
    for item in sampler:
        if isinstance(item, (list, tuple)):
            out.extend(int(i) for i in item)
        else:
            out.append(int(item))
    return out


def _check_sampler(
    sampler: Any, num_samples: int, ctx: DistributedContext, allowed_tail: int
) -> CheckResult:
    if sampler is None:
        sampler = range(num_samples)  # what a DataLoader without a sampler reads
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(0)
    first = _indices(sampler)
    if callable(set_epoch):
        set_epoch(1)
    second = _indices(sampler)
    if callable(set_epoch):
        set_epoch(0)
    shards = _gather((first, second), ctx)
    world = ctx.world_size
    counts = [len(s[0]) for s in shards]
    everything = [i for s in shards for i in s[0]]
    unique = set(everything)
    shared = len(everything) - len(unique)
    missing = num_samples - len(unique)
    reshuffled = any(s[0] != s[1] for s in shards)
    problems = []
    if shared > world - 1:  # DistributedSampler pads with at most world-1 repeats
        problems.append(
            f"shards overlap: {shared} of {len(everything)} samples drawn by more than one "
            f"rank (use a DistributedSampler, or make_distributed_sampler)"
        )
    if missing > allowed_tail:
        problems.append(f"{missing} of {num_samples} samples never drawn by any rank")
    if len(set(counts)) > 1:
        problems.append(f"ranks get different numbers of samples {counts}: the last step hangs")
    if not reshuffled:
        problems.append("epoch 1 draws the same order as epoch 0 (shuffle, and set_epoch)")
    if problems:
        return CheckResult("sampler", False, "; ".join(problems))
    detail = (
        f"{world} shard(s) of {counts[0]} samples, disjoint ({shared} padding repeats), "
        f"{len(unique)} of {num_samples} covered, reshuffled at epoch 1"
    )
    return CheckResult("sampler", True, detail)


def _batch(dataset: Dataset[Any], indices: Sequence[int], device: torch.device) -> Batch:
    items = [dataset[i] for i in indices]
    inputs, targets = move_to_device(default_collate(items), device)
    return inputs, targets


# --- the checks ---------------------------------------------------------------------------


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


def _grads(model: nn.Module) -> list[tuple[str, torch.Tensor | None]]:
    return [(n, p.grad) for n, p in unwrap_model(model).named_parameters() if p.requires_grad]


def _compare_grads(
    model: nn.Module, reference: nn.Module, rtol: float, atol: float, ctx: DistributedContext
) -> tuple[bool, str]:
    """Whether every rank's gradients match the reference model's; a one-line detail.

    A parameter passes when ``max|g - g_ref| <= atol + rtol * max|g_ref|``.
    """
    expected = dict(_grads(reference))
    largest, failure = 0.0, None
    for name, grad in _grads(model):
        ref = expected.get(name)
        if (grad is None) != (ref is None):
            failure = failure or (float("inf"), name, 0.0, "has a gradient on one side only")
            continue
        if grad is None or ref is None:
            continue
        scale = float(ref.detach().abs().max())
        diff = float((grad.detach().double() - ref.detach().double()).abs().max())
        largest = max(largest, diff)
        if not diff <= atol + rtol * scale and (failure is None or diff > failure[0]):
            failure = (diff, name, scale, "")
    verdicts = _gather((largest, failure), ctx)
    for rank, (_, fail) in enumerate(verdicts):
        if fail is not None:
            diff, name, scale, why = fail
            if why:
                return False, f"rank {rank}: '{name}' {why}"
            return False, (
                f"rank {rank}: '{name}' max |Δ| {diff:.3g} vs max |g| {scale:.3g} "
                f"({diff / max(scale, 1e-30):.2g}x; tolerance {atol:g} + {rtol:g}·max|g|)"
            )
    diff = max(v[0] for v in verdicts)
    return True, f"max |Δ| {diff:.2g} (tolerance {atol:g} + {rtol:g}·max|g|)"


class _SyncCounter:
    """Counts the gradient buckets DDP all-reduces (through a comm hook that then reduces)."""

    def __init__(self) -> None:
        self.buckets = 0

    def hook(self) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counting_allreduce(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
            self.buckets += 1
            return allreduce_hook(state, bucket)

        # DDP checks these annotations as objects; postponed (string) ones would fail its check.
        counting_allreduce.__annotations__ = {
            "state": object,
            "bucket": dist.GradBucket,  # type: ignore[attr-defined, unused-ignore]
            "return": torch.futures.Future[torch.Tensor],
        }
        return counting_allreduce


def _shared_tmpdir(ctx: DistributedContext, given: str | os.PathLike[str] | None) -> Path:
    if given is not None:
        return Path(given)
    path = [tempfile.mkdtemp(prefix="gpu-training-verify-") if ctx.is_main_process else ""]
    if _distributed(ctx):
        dist.broadcast_object_list(path, src=0)
    return Path(path[0])


def _wrap(model: nn.Module, ctx: DistributedContext, device: torch.device) -> nn.Module:
    if not _distributed(ctx):
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def _loss(model: nn.Module, batches: Sequence[Batch], loss_fn: LossFn) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for inputs, targets in batches:
        total += loss_fn(model(inputs), targets).detach().double().cpu()
    return total / len(batches)


def verify_setup(
    build_model: Callable[[], nn.Module],
    dataset: Dataset[Any],
    loss_fn: LossFn,
    ctx: DistributedContext,
    *,
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
        loss_fn: ``loss_fn(model(inputs), targets)`` → the micro-batch mean loss.
        ctx: This process's context (the process group is initialised when distributed).
        batch_size: Per-device micro-batch.
        accum_steps: Micro-batches per optimizer step in the accumulation check.
        make_sampler: ``make_sampler(dataset, ctx)`` → the training sampler (an index sampler
            or a batch sampler); default: the Trainer's
            :class:`~gpu_training.data.GlobalBatchSampler`.
        accumulate: ``accumulate(model, micro_batches, loss_fn)`` runs one accumulation
            window's forward and backward passes (the user's own loop); default
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
        VerifyInputError: If the dataset is smaller than one global batch, or a batch size
            is not positive.
    """
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
        cuda = _distributed(ctx) and dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if make_sampler is None:
        from gpu_training.data import GlobalBatchSampler

        def make_sampler(data: Dataset[Any], c: DistributedContext) -> Any:
            return GlobalBatchSampler(num_samples, global_batch, batch_size, c, seed=seed)

    accumulate = accumulate or default_accumulate
    report = VerifyReport(world_size=world, backend=ctx.backend)
    report.setup = (
        f"{world} rank(s){f' ({ctx.backend})' if ctx.backend else ''}, micro-batch "
        f"{batch_size} x {accum_steps} accumulation = global batch {global_batch}, "
        f"{device.type}, fp32, eval mode for the gradient checks"
    )
    tail = max(global_batch, world)  # samples a sampler may drop at the end of an epoch
    report.checks.append(_check_sampler(make_sampler(dataset, ctx), num_samples, ctx, tail))

    # One permutation, the same everywhere: global batch k is positions k*G..(k+1)*G.
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed)).tolist()

    def micro(step: int, rank: int, a: int) -> list[int]:
        start = (step * global_batch + (rank * accum_steps + a) * batch_size) % num_samples
        return [order[(start + i) % num_samples] for i in range(batch_size)]

    def window(step: int, rank: int) -> list[Batch]:
        return [_batch(dataset, micro(step, rank, a), device) for a in range(accum_steps)]

    torch.manual_seed(seed)
    model = build_model().to(device)
    results = _diff_from_rank0(list(unwrap_model(model).named_parameters()), ctx)
    bad = [(r, d, n) for r, (d, n) in enumerate(results) if d != 0.0]
    if bad:
        rank, diff, name = bad[0]
        report.checks.append(
            CheckResult(
                "init",
                False,
                f"rank {rank}'s '{name}' differs from rank 0's by {diff:.3g} as built: seed "
                "before building the model (DDP hides this by broadcasting rank 0's weights; "
                "FSDP and ZeRO-3 do not)",
            )
        )
    else:
        report.checks.append(CheckResult("init", True, f"parameters identical on {world} rank(s)"))

    wrapped = _wrap(model, ctx, device)
    counter = _SyncCounter()
    if wrapped is not model:
        wrapped.register_comm_hook(state=None, hook=counter.hook())  # type: ignore[operator]
    reference = copy.deepcopy(unwrap_model(wrapped))
    wrapped.eval()
    reference.eval()
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)

    # grad_sync: one micro-batch per rank vs the concatenation on one process.
    mine = [_batch(dataset, micro(0, ctx.rank, 0), device)]
    everyone = [_batch(dataset, micro(0, r, 0), device) for r in range(world)]
    optimizer.zero_grad(set_to_none=True)
    counter.buckets = 0
    loss_fn(wrapped(mine[0][0]), mine[0][1]).backward()
    buckets_per_sync = max(1, counter.buckets)
    reference.zero_grad(set_to_none=True)
    inputs = torch.cat([b[0] for b in everyone])
    targets = torch.cat([b[1] for b in everyone])
    loss_fn(reference(inputs), targets).backward()
    ok, detail = _compare_grads(wrapped, reference, rtol, atol, ctx)
    report.checks.append(
        CheckResult(
            "grad_sync",
            ok,
            f"DDP gradient vs one process on the {len(inputs)}-sample batch: {detail}"
            if ok
            else f"DDP gradient != one process on the {len(inputs)}-sample batch: {detail}",
        )
    )

    # params_after_step: a training-mode step (a module that changes parameters in its
    # forward, from its own batch, shows up here), then the same weights everywhere?
    optimizer.zero_grad(set_to_none=True)
    wrapped.train()
    loss_fn(wrapped(mine[0][0]), mine[0][1]).backward()
    optimizer.step()
    wrapped.eval()
    results = _diff_from_rank0(list(unwrap_model(wrapped).named_parameters()), ctx)
    rank, (diff, name) = max(enumerate(results), key=lambda item: item[1][0])
    if diff <= atol:
        report.checks.append(
            CheckResult(
                "params_after_step",
                True,
                f"identical on {world} rank(s) after a train-mode AdamW step (max |Δ| {diff:.2g})",
            )
        )
    else:
        report.checks.append(
            CheckResult(
                "params_after_step",
                False,
                f"rank {rank}'s '{name}' differs from rank 0's by {diff:.3g} after one step: "
                "something changes parameters outside DDP's gradient sync",
            )
        )

    # accumulation: the user's window (default: no_sync + 1/A) vs the big batch.
    reference.load_state_dict(unwrap_model(wrapped).state_dict())
    optimizer.zero_grad(set_to_none=True)
    counter.buckets = 0
    accumulate(wrapped, window(1, ctx.rank), loss_fn)
    syncs = counter.buckets / buckets_per_sync
    big = [b for r in range(world) for b in window(1, r)]
    reference.zero_grad(set_to_none=True)
    loss_fn(reference(torch.cat([b[0] for b in big])), torch.cat([b[1] for b in big])).backward()
    ok, detail = _compare_grads(wrapped, reference, rtol, atol, ctx)
    problems = [] if ok else [f"gradient != the {global_batch}-sample batch's: {detail}"]
    synced = _gather(syncs, ctx)
    if wrapped is not model and max(synced) > 1:
        problems.append(
            f"gradients all-reduced on {max(synced):g} of {accum_steps} micro-steps: wrap the "
            "non-final ones in model.no_sync() (gpu_training.ddp.gradient_sync)"
        )
    if problems:
        report.checks.append(CheckResult("accumulation", False, "; ".join(problems)))
    else:
        report.checks.append(
            CheckResult(
                "accumulation",
                True,
                f"{accum_steps} micro-steps = the {global_batch}-sample batch, {detail}; "
                "one all-reduce per window",
            )
        )

    report.checks.append(
        _check_checkpoint(
            wrapped,
            optimizer,
            build_model,
            lambda: window(2, ctx.rank),
            loss_fn,
            ctx,
            device,
            seed,
            checkpoint_dir,
        )
    )
    del wrapped, model, reference, optimizer  # free DDP's reducer before the group goes
    return report


def _train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[Batch],
    loss_fn: LossFn,
) -> torch.Tensor:
    loss = _loss(model, batches, loss_fn)
    optimizer.zero_grad(set_to_none=True)
    default_accumulate(model, batches, loss_fn)
    optimizer.step()
    return loss


def _check_checkpoint(
    wrapped: nn.Module,
    optimizer: torch.optim.Optimizer,
    build_model: Callable[[], nn.Module],
    next_batches: Callable[[], list[Batch]],
    loss_fn: LossFn,
    ctx: DistributedContext,
    device: torch.device,
    seed: int,
    checkpoint_dir: str | os.PathLike[str] | None,
) -> CheckResult:
    from gpu_training.checkpoint import CheckpointManager
    from gpu_training.resume import capture_training_state, restore_training_state

    directory = _shared_tmpdir(ctx, checkpoint_dir)
    try:
        optimizer.zero_grad(set_to_none=True)
        ckpt = CheckpointManager(directory, ctx=ctx, keep_last_n=1)
        ckpt.save(capture_training_state(ctx, wrapped, optimizer, step=1), step=1)
        batches = next_batches()
        loss_before = _train_step(wrapped, optimizer, batches, loss_fn)
        after = {k: v.detach().clone() for k, v in unwrap_model(wrapped).state_dict().items()}

        torch.manual_seed(seed + 7919)  # a different init: only the checkpoint can restore it
        fresh = _wrap(build_model().to(device), ctx, device)
        fresh.eval()
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        restore_training_state(ckpt.load(map_location=device), ctx, fresh, fresh_opt)
        loss_after = _train_step(fresh, fresh_opt, batches, loss_fn)
        resumed = unwrap_model(fresh).state_dict()
        differs = [k for k, v in after.items() if not torch.equal(v, resumed[k])]
        del fresh, fresh_opt
    finally:
        if checkpoint_dir is None:
            ctx.barrier()
            if ctx.is_main_process:
                shutil.rmtree(directory, ignore_errors=True)
    verdicts = _gather((float(loss_before), float(loss_after), differs[:3]), ctx)
    for rank, (before, again, keys) in enumerate(verdicts):
        if before != again or keys:
            what = f"loss {before!r} before vs {again!r} after the round-trip"
            if keys:
                what += f"; weights differ after the step in {keys}"
            return CheckResult("checkpoint", False, f"rank {rank}: {what}")
    return CheckResult(
        "checkpoint",
        True,
        f"save, load into a fresh model: next step's loss {verdicts[0][0]:.6f} identical "
        "bit for bit, weights after it equal",
    )
