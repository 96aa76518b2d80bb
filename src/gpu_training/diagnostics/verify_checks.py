"""The checks :func:`~gpu_training.diagnostics.verify.verify_setup` runs, one function each.

Each check is a collective (every rank calls it, in
:data:`~gpu_training.diagnostics.verify.CHECKS` order) and returns a :class:`CheckResult`,
identical on every rank. :func:`check_sampler`, :func:`check_data` and :func:`check_init` look
at the sampler, the dataset and the freshly built model; :func:`check_grad_sync`,
:func:`check_params_after_step`, :func:`check_accumulation` and :func:`check_checkpoint` train:
they read their batches from the run's :class:`~gpu_training.diagnostics.verify.VerifyPlan` and
advance the shared :class:`~gpu_training.diagnostics.verify.VerifyModels` one after the other.
Their reference gradients are computed on the batches the ranks actually drew (gathered), so a
dataset that differs per rank fails ``data``, not the gradient checks. The cross-rank
comparisons they rest on live here too, with :func:`default_accumulate` (the toolkit's
accumulation window) and :func:`unused_parameters`; :mod:`~gpu_training.diagnostics.verify`
holds the report, the run's setup and the entry points.

Example:
    >>> import torch
    >>> from gpu_training.ddp import DistributedContext
    >>> check_init(torch.nn.Linear(2, 1), DistributedContext())
    CheckResult(name='init', passed=True, detail='parameters and buffers identical on 1 rank(s)')
    >>> check_sampler(range(8), 8, DistributedContext(), allowed_tail=0).detail
    'epoch 1 draws the same order as epoch 0 (shuffle, and set_epoch)'
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from gpu_training.ddp import (
    DistributedContext,
    gradient_sync,
    move_to_device,
    process_group_up,
    unwrap_model,
)

if TYPE_CHECKING:  # the run's types are built by verify_setup, which imports this module
    from gpu_training.diagnostics.verify import VerifyModels, VerifyPlan

__all__ = [
    "CheckResult",
    "check_accumulation",
    "check_checkpoint",
    "check_data",
    "check_grad_sync",
    "check_init",
    "check_params_after_step",
    "check_sampler",
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
        name: One of :data:`~gpu_training.diagnostics.verify.CHECKS`.
        passed: The verdict (identical on every rank).
        detail: The numbers behind it, one line.
    """

    name: str
    passed: bool
    detail: str


# --- across ranks: comparisons and the DDP wrapper ----------------------------------------


def _distributed(ctx: DistributedContext) -> bool:
    return ctx.is_distributed and process_group_up()


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


def _wrap(
    model: nn.Module,
    ctx: DistributedContext,
    device: torch.device,
    *,
    find_unused_parameters: bool = False,
) -> nn.Module:
    """``model`` in DDP when a process group is up (DDP broadcasts rank 0's weights), else as is."""
    if not _distributed(ctx):
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(
        model, device_ids=device_ids, find_unused_parameters=find_unused_parameters
    )


def _gather_batches(batches: list[Batch], plan: VerifyPlan) -> list[list[Batch]]:
    """Every rank's ``batches``, indexed by rank, on ``plan.device``.

    The reference gradients are computed on these, not on batches read again here: a dataset
    that differs per rank (or draws a random augmentation per read) would otherwise make a
    correct gradient sync look wrong.
    """
    cpu = torch.device("cpu")
    # Through the CPU: a pickled CUDA tensor would unpickle onto the sender's device index.
    gathered = _gather(move_to_device(batches, cpu), plan.ctx)
    return [move_to_device(list(b), plan.device) for b in gathered]


def _cat(batches: Sequence[Batch]) -> Batch:
    """One batch holding ``batches`` one after the other."""
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


# --- sampler and init ---------------------------------------------------------------------


def _indices(sampler: Any) -> list[int]:
    out: list[int] = []
    for item in sampler:
        if isinstance(item, (list, tuple)):
            out.extend(int(i) for i in item)
        else:
            out.append(int(item))
    return out


def check_sampler(
    sampler: Any, num_samples: int, ctx: DistributedContext, allowed_tail: int
) -> CheckResult:
    """``sampler``: the shards are disjoint and complete, equal in size, reshuffled at epoch 1.

    Args:
        sampler: This rank's training sampler, an index or a batch sampler (None: what a
            DataLoader without one reads, ``range(num_samples)``).
        num_samples: The dataset's size.
        ctx: This process's context.
        allowed_tail: Samples the ranks together may leave undrawn (an epoch's dropped tail).

    Returns:
        The verdict; a failure lists every problem found.
    """
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


def _feed(digest: Any, obj: Any) -> None:
    """Hash ``obj`` (tensors, arrays, mappings, sequences, scalars) into ``digest``."""
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif hasattr(obj, "tobytes") and hasattr(obj, "dtype"):  # a NumPy array: repr abbreviates
        digest.update(f"A{obj.dtype}{getattr(obj, 'shape', ())}".encode() + obj.tobytes())
    elif isinstance(obj, Mapping):
        digest.update(b"{")
        for key in sorted(obj, key=repr):
            _feed(digest, key)
            _feed(digest, obj[key])
        digest.update(b"}")
    elif isinstance(obj, (list, tuple)):
        digest.update(b"[")
        for item in obj:
            _feed(digest, item)
        digest.update(b"]")
    else:
        digest.update(f"{type(obj).__name__}:{obj!r}".encode())


def _sample_digest(sample: Any) -> str:
    digest = hashlib.blake2b(digest_size=16)
    _feed(digest, sample)
    return digest.hexdigest()


_DATA_SAMPLES = 256
"""At most this many samples are compared by :func:`check_data` (each is read twice)."""


def check_data(plan: VerifyPlan) -> CheckResult:
    """``data``: every rank reads the same samples from the dataset.

    The samples the training checks use (three global batches of the plan's permutation, at
    most :data:`_DATA_SAMPLES`) are read twice on every rank and hashed. If a rank reads a
    sample differently from rank 0, the dataset was built differently per rank — a data bug,
    reported here; the gradient checks compare against the batches the ranks actually drew,
    so they do not blame the gradients for it. Samples that change from one read to the next
    (a random augmentation) cannot be compared and pass with a note.

    Args:
        plan: The run.

    Returns:
        The verdict; a failure names the rank, how many samples differ and the first index.
    """
    ctx, n = plan.ctx, plan.num_samples
    reads = min(3 * plan.global_batch, _DATA_SAMPLES)
    indices = sorted({plan.order[k % n] for k in range(reads)})
    first = [_sample_digest(plan.dataset[i]) for i in indices]
    again = [_sample_digest(plan.dataset[i]) for i in indices]
    changing = sum(a != b for a, b in zip(first, again, strict=True))
    everyone = _gather((n, first, changing), ctx)
    if any(view[2] for view in everyone):
        worst = max(range(len(everyone)), key=lambda r: everyone[r][2])
        return CheckResult(
            "data",
            True,
            f"{everyone[worst][2]} of {len(indices)} samples change from one read to the next "
            f"on rank {worst} (a random augmentation?): not compared across ranks; the "
            "gradient checks use the batches the ranks drew",
        )
    size0, digests0, _ = everyone[0]
    for rank, (size, digests, _) in enumerate(everyone):
        if size != size0:
            return CheckResult(
                "data",
                False,
                f"rank {rank}'s dataset has {size} samples, rank 0's {size0}: every rank "
                "must build the same dataset",
            )
        # Same size, same seed: every rank read the same indices.
        differ = [i for i, a, b in zip(indices, digests0, digests, strict=True) if a != b]
        if differ:
            return CheckResult(
                "data",
                False,
                f"rank {rank}'s samples differ from rank 0's in {len(differ)} of the "
                f"{len(indices)} read (first: index {differ[0]}): every rank must build the "
                "same dataset (seed before building it, or read it from files) and its "
                "sampler picks the shard; the gradient checks use the batches the ranks drew",
            )
    return CheckResult(
        "data",
        True,
        f"{len(indices)} samples read identically on {ctx.world_size} rank(s)",
    )


def check_init(model: nn.Module, ctx: DistributedContext) -> CheckResult:
    """``init``: every rank built the same parameters and buffers (DDP's broadcast hides it).

    A buffer that differs per rank trains right under DDP (it broadcasts rank 0's buffers at
    construction) but wrong under FSDP and DeepSpeed, which do not: the failure says so.

    Args:
        model: This rank's freshly built, unwrapped model.
        ctx: This process's context.

    Returns:
        The verdict; a failure names the first rank and parameter (or buffer) that differ.
    """
    module = unwrap_model(model)
    params = _diff_from_rank0(list(module.named_parameters()), ctx)
    buffers = _diff_from_rank0(list(module.named_buffers()), ctx)
    bad = [(r, d, n) for r, (d, n) in enumerate(params) if d != 0.0]
    if bad:
        rank, diff, name = bad[0]
        return CheckResult(
            "init",
            False,
            f"rank {rank}'s '{name}' differs from rank 0's by {diff:.3g} as built: seed "
            "before building the model (DDP hides this by broadcasting rank 0's weights; "
            "FSDP and ZeRO-3 do not)",
        )
    bad = [(r, d, n) for r, (d, n) in enumerate(buffers) if d != 0.0]
    if bad:
        rank, diff, name = bad[0]
        return CheckResult(
            "init",
            False,
            f"rank {rank}'s buffer '{name}' differs from rank 0's by {diff:.3g} as built: "
            "build it the same on every rank (DDP hides this by broadcasting rank 0's "
            "buffers; FSDP and DeepSpeed do not, and would train each rank with its own)",
        )
    return CheckResult(
        "init", True, f"parameters and buffers identical on {ctx.world_size} rank(s)"
    )


# --- gradients ----------------------------------------------------------------------------


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
    anywhere: set[str] = set().union(*_gather(sorted(here), ctx))
    return [n for n, _ in named if n in anywhere]


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


def _unused_detail(names: Sequence[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:6])
    more = f" and {len(names) - 6} more" if len(names) > 6 else ""
    return (
        f"{len(names)} parameter(s) get no gradient from forward: {shown}{more}; DDP raises "
        "'Expected to have finished reduction' at the next step: use them, freeze them "
        "(requires_grad=False) or pass find_unused_parameters=True (strategy "
        "find_unused_parameters: true, a graph walk per step)"
    )


def check_grad_sync(plan: VerifyPlan, models: VerifyModels) -> CheckResult:
    """``grad_sync``: one micro-batch per rank through DDP vs their concatenation in one process.

    Fails too, naming them, when some parameters get no gradient (``models.unused``): the
    checks then run with ``find_unused_parameters=True``, which the user's DDP lacks.

    Args:
        plan: The run.
        models: The shared models, fresh from :meth:`VerifyModels.build`.

    Returns:
        The verdict, with the largest gradient difference.
    """
    wrapped, reference, loss_fn = models.wrapped, models.reference, plan.loss_fn
    everyone = [b for batches in _gather_batches([models.first], plan) for b in batches]
    models.optimizer.zero_grad(set_to_none=True)
    loss_fn(wrapped(models.first[0]), models.first[1]).backward()
    reference.zero_grad(set_to_none=True)
    inputs, targets = _cat(everyone)
    loss_fn(reference(inputs), targets).backward()
    ok, detail = _compare_grads(wrapped, reference, plan.rtol, plan.atol, plan.ctx)
    verdict = (
        f"DDP gradient vs one process on the {len(inputs)}-sample batch: {detail}"
        if ok
        else f"DDP gradient != one process on the {len(inputs)}-sample batch: {detail}"
    )
    if models.unused:
        return CheckResult("grad_sync", False, f"{_unused_detail(models.unused)}; {verdict}")
    return CheckResult("grad_sync", ok, verdict)


def check_params_after_step(plan: VerifyPlan, models: VerifyModels) -> CheckResult:
    """``params_after_step``: after one training-mode AdamW step the weights are equal everywhere.

    The forward runs in ``train()`` mode, so a module that changes parameters in its forward
    from its own batch (outside DDP's gradient sync) shows up here.

    Args:
        plan: The run.
        models: The shared models (the step advances them).

    Returns:
        The verdict; a failure names the rank and parameter that differ most.
    """
    wrapped = models.wrapped
    models.optimizer.zero_grad(set_to_none=True)
    wrapped.train()
    plan.loss_fn(wrapped(models.first[0]), models.first[1]).backward()
    models.optimizer.step()
    wrapped.eval()
    results = _diff_from_rank0(list(unwrap_model(wrapped).named_parameters()), plan.ctx)
    rank, (diff, name) = max(enumerate(results), key=lambda item: item[1][0])
    if diff <= plan.atol:
        return CheckResult(
            "params_after_step",
            True,
            f"identical on {plan.ctx.world_size} rank(s) after a train-mode AdamW step "
            f"(max |Δ| {diff:.2g})",
        )
    return CheckResult(
        "params_after_step",
        False,
        f"rank {rank}'s '{name}' differs from rank 0's by {diff:.3g} after one step: "
        "something changes parameters outside DDP's gradient sync",
    )


def check_accumulation(
    plan: VerifyPlan, models: VerifyModels, accumulate: AccumulateFn
) -> CheckResult:
    """``accumulation``: an accumulation window gives the big batch's gradient, syncing once.

    Args:
        plan: The run.
        models: The shared models, after :func:`check_params_after_step`.
        accumulate: Runs one window's forward and backward passes (the user's loop, or
            :func:`default_accumulate`).

    Returns:
        The verdict; a failure says whether the gradient or the all-reduce count is wrong.
    """
    ctx, loss_fn = plan.ctx, plan.loss_fn
    wrapped, reference = models.wrapped, models.reference
    reference.load_state_dict(unwrap_model(wrapped).state_dict())
    models.optimizer.zero_grad(set_to_none=True)
    window = plan.window(1, ctx.rank)
    models.counter.syncs = 0
    accumulate(wrapped, window, loss_fn)
    syncs = models.counter.syncs
    big = [b for batches in _gather_batches(window, plan) for b in batches]
    reference.zero_grad(set_to_none=True)
    inputs, targets = _cat(big)
    loss_fn(reference(inputs), targets).backward()
    ok, detail = _compare_grads(wrapped, reference, plan.rtol, plan.atol, ctx)
    problems = [] if ok else [f"gradient != the {plan.global_batch}-sample batch's: {detail}"]
    synced = _gather(syncs, ctx)
    if models.ddp and max(synced) > 1:
        problems.append(
            f"gradients all-reduced on {max(synced):g} of {plan.accum_steps} micro-steps: wrap "
            "the non-final ones in model.no_sync() (gpu_training.ddp.gradient_sync)"
        )
    if problems:
        return CheckResult("accumulation", False, "; ".join(problems))
    return CheckResult(
        "accumulation",
        True,
        f"{plan.accum_steps} micro-steps = the {plan.global_batch}-sample batch, {detail}; "
        "one all-reduce per window",
    )


# --- checkpoint round-trip ----------------------------------------------------------------


def _shared_tmpdir(ctx: DistributedContext, given: str | os.PathLike[str] | None) -> Path:
    if given is not None:
        return Path(given)
    path = [tempfile.mkdtemp(prefix="gpu-training-verify-") if ctx.is_main_process else ""]
    if _distributed(ctx):
        dist.broadcast_object_list(path, src=0)
    return Path(path[0])


def _loss(model: nn.Module, batches: Sequence[Batch], loss_fn: LossFn) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for inputs, targets in batches:
        total += loss_fn(model(inputs), targets).detach().double().cpu()
    return total / len(batches)


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


def check_checkpoint(
    plan: VerifyPlan,
    models: VerifyModels,
    build_model: Callable[[], nn.Module],
    checkpoint_dir: str | os.PathLike[str] | None,
) -> CheckResult:
    """``checkpoint``: save, load into a fresh model and optimizer, take the next step.

    The round-trip is :class:`~gpu_training.checkpoint.CheckpointManager` with
    :func:`~gpu_training.resume.capture_training_state`, as the Trainer does it; the next
    step's loss and the weights after it must be bitwise those of the uninterrupted run.

    Args:
        plan: The run.
        models: The shared models (their step continues from the others').
        build_model: Builds the fresh model (with a different seed: only the checkpoint
            can restore the weights).
        checkpoint_dir: A shared directory (None: a temporary one, removed afterwards).

    Returns:
        The verdict; a failure names the rank, both losses and the first differing weights.
    """
    from gpu_training.checkpoint import CheckpointManager
    from gpu_training.resume import capture_training_state, restore_training_state

    ctx, device, loss_fn = plan.ctx, plan.device, plan.loss_fn
    wrapped, optimizer = models.wrapped, models.optimizer
    directory = _shared_tmpdir(ctx, checkpoint_dir)
    try:
        optimizer.zero_grad(set_to_none=True)
        ckpt = CheckpointManager(directory, ctx=ctx, keep_last_n=1)
        ckpt.save(capture_training_state(ctx, wrapped, optimizer, step=1), step=1)
        batches = plan.window(2, ctx.rank)
        loss_before = _train_step(wrapped, optimizer, batches, loss_fn)
        after = {k: v.detach().clone() for k, v in unwrap_model(wrapped).state_dict().items()}

        torch.manual_seed(plan.seed + 7919)  # a different init: only the checkpoint can restore it
        fresh = _wrap(
            build_model().to(device), ctx, device, find_unused_parameters=bool(models.unused)
        )
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
