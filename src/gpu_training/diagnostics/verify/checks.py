"""The checks of ``gpu-training verify`` that train nothing: the sampler, the data, the init.

Each check is a collective (every rank calls it, in
:data:`~gpu_training.diagnostics.verify.report.CHECKS` order) and returns a
:class:`~gpu_training.diagnostics.verify.plan.CheckResult`, identical on every rank.
:func:`check_sampler`, :func:`check_data` and :func:`check_init` look at the sampler, the
dataset and the freshly built model; the checks that train are in
:mod:`~gpu_training.diagnostics.verify.training_checks`.

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
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from gpu_training.ddp import DistributedContext, unwrap_model
from gpu_training.diagnostics.verify.plan import CheckResult, VerifyPlan
from gpu_training.diagnostics.verify.ranks import diff_from_rank0, gather_objects

__all__ = ["check_data", "check_init", "check_sampler"]


# --- sampler ------------------------------------------------------------------------------


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
    shards = gather_objects((first, second), ctx)
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


# --- data ---------------------------------------------------------------------------------


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
    everyone = gather_objects((n, first, changing), ctx)
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


# --- init ---------------------------------------------------------------------------------


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
    params = diff_from_rank0(list(module.named_parameters()), ctx)
    buffers = diff_from_rank0(list(module.named_buffers()), ctx)
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
