"""A NaN or Inf in one rank's step, agreed on, named and stopped on every rank.

What :class:`~gpu_training.amp.MixedPrecisionStepper` uses when built with
``max_nonfinite_steps`` (the Trainer's ``training.max_nonfinite_steps``): the diagnosis of a
skipped step (:class:`NonFiniteStep`: which ranks' losses were non-finite, the first
non-finite gradient, how many in a row), the one small all-gather that collects it
(:func:`gather_flags`, only on a skipped step) and the line a loop prints or the error it
raises at the limit (:func:`nonfinite_warning`, :class:`NonFiniteError`). docs/troubleshooting.md,
"The loss went NaN", says how the ranks agree without a collective of their own.

Example:
    >>> NonFiniteStep(loss_ranks=(1,), parameter="fc.weight", in_a_row=1).describe()
    'non-finite loss on rank 1 (first non-finite gradient: fc.weight)'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # pragma: no cover
    from gpu_training.amp import MixedPrecisionStepper

__all__ = [
    "NonFiniteError",
    "NonFiniteStep",
    "first_nonfinite",
    "gather_flags",
    "nonfinite_warning",
    "parameter_name",
    "skipped_now",
]

Names = Callable[[], Iterable[tuple[str, torch.nn.Parameter]]]
"""``model.named_parameters``: called only for a skipped step."""


class NonFiniteError(RuntimeError):
    """Too many optimizer steps in a row had a NaN/Inf (``training.max_nonfinite_steps``).

    Raised on every rank at the same step (each saw the same flags), so no rank is left in a
    collective; the message names the step, the ranks whose loss was non-finite and the first
    non-finite gradient.
    """


@dataclass(frozen=True)
class NonFiniteStep:
    """What a step skipped for a NaN/Inf found, the same on every rank (see
    :class:`~gpu_training.amp.MixedPrecisionStepper`'s ``max_nonfinite_steps``)."""

    loss_ranks: tuple[int, ...]
    """Ranks whose loss was NaN/Inf in one of the step's micro-batches (empty: only the
    gradients were: an overflow, or a NaN that arose in backward)."""

    parameter: str | None
    """The first parameter, in the model's order, whose gradient held a NaN/Inf (after the
    gradients' all-reduce, so the same on every rank); None without parameter names."""

    in_a_row: int
    """Non-finite steps in a row, this one included."""

    steps_ago: int = 0
    """1 when the step was found one step later (its flags stayed on the GPU: a fused
    optimizer skipped it there, see :mod:`gpu_training.nonfinite_guard`), else 0."""

    def describe(self) -> str:
        """``non-finite loss on rank 1 (first non-finite gradient: fc.weight)``."""
        where = (
            f"loss on rank{'s' if len(self.loss_ranks) > 1 else ''} "
            + ",".join(map(str, self.loss_ranks))
            if self.loss_ranks
            else "gradients (the loss was finite on every rank)"
        )
        grad = f" (first non-finite gradient: {self.parameter})" if self.parameter else ""
        return f"non-finite {where}{grad}"


def nonfinite_warning(
    stepper: MixedPrecisionStepper | None, step: int, *, settle: bool = False
) -> str | None:
    """The warning for optimizer step ``step`` (1-based) if it was skipped for a NaN/Inf.

    What a loop prints (rank 0) after each step with a guarded stepper; the Trainer and
    :func:`~gpu_training.ddp.train_one_epoch` do. A skip found a step later (a fused CUDA
    optimizer: :mod:`~gpu_training.nonfinite_guard`) names the step it happened at.
    ``settle=True`` reads such flags now (every rank at the same step: before a checkpoint,
    at a log step, after the last step), so nothing is left unread there.

    Raises:
        NonFiniteError: On every rank alike, when ``max_nonfinite_steps`` steps in a row were
            skipped.
    """
    if stepper is None:
        return None
    if settle:
        stepper.settle()
    bad = stepper.last_nonfinite
    if bad is None:
        return None
    step -= bad.steps_ago  # found a step later: name the step it happened at
    limit = stepper.max_nonfinite_steps
    if limit is not None and bad.in_a_row >= limit:
        raise NonFiniteError(
            f"step {step}: {bad.describe()}; {bad.in_a_row} steps in a row were non-finite, "
            "each skipped on every rank: the run stops (its last checkpoint is intact). Lower "
            "the learning rate, look at the data of these steps, or raise "
            "training.max_nonfinite_steps"
        )
    return (
        f"warning: step {step}: {bad.describe()}: skipped on every rank "
        f"({bad.in_a_row} in a row; the run stops at {limit})"
    )


def skipped_now(stepper: MixedPrecisionStepper | None) -> bool:
    """Whether the step just taken was skipped for a NaN/Inf (known now, not a step later)."""
    bad = stepper.last_nonfinite if stepper is not None else None
    return bad is not None and bad.steps_ago == 0


def _clean(name: str) -> str:
    """A parameter's name as the user's model has it (without DDP's / compile's wrappers)."""
    for prefix in ("module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(prefix, "")
    return name


def first_nonfinite(named: Iterable[tuple[str, torch.nn.Parameter]]) -> int:
    """Index, in ``named``'s order, of the first parameter whose gradient (this rank's part
    of it under FSDP2) holds a NaN/Inf; -1 if none does. One host sync per parameter: for
    the rare skipped step only."""
    for index, (_, param) in enumerate(named):
        grad = param.grad
        if grad is None:
            continue
        local = grad.to_local() if hasattr(grad, "to_local") else grad  # an FSDP2 shard
        if local.numel() and not bool(torch.isfinite(local).all()):
            return index
    return -1


def gather_flags(loss_bad: bool, index: int) -> list[tuple[int, int]]:
    """Every rank's ``(its loss was non-finite, its first non-finite gradient's index)``.

    One small all-gather when distributed: every rank calls it on the same (skipped) step.
    """
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return [(int(loss_bad), index)]
    from gpu_training.process_group import collective_device

    mine = torch.tensor([int(loss_bad), index], device=collective_device())
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [(int(t[0]), int(t[1])) for t in every]


def parameter_name(flags: Sequence[tuple[int, int]], names: Names | None) -> str | None:
    """The name of the first non-finite gradient any rank found (FSDP2: each saw its
    shards), the same on every rank; None without names or a non-finite gradient."""
    found = [index for _, index in flags if index >= 0]
    if not found or names is None:
        return None
    first = min(found)
    return next((_clean(n) for i, (n, _) in enumerate(names()) if i == first), None)
