"""A global-batch sampler: the same training run on 1, 2 or N ranks, resumable on any of them.

A job is defined by its *global* batch ``G``: the samples one optimizer step sees. On ``W``
ranks with a per-device batch ``B`` it takes ``A = G / (W × B)`` accumulation micro-steps.
:class:`GlobalBatchSampler` draws one seeded permutation per epoch, cuts it into global batches
of ``G`` (dropping the incomplete tail) and gives each rank its ``A`` micro-batches of every
global batch. Which samples form global step ``k`` depends only on the seed, the epoch and
``G`` — never on ``W``, ``A`` or ``B`` — so a run on 1 rank × 4 micro-steps, 2 × 2 or 4 × 1
applies the same updates, and a checkpoint saved on 2 ranks resumes on 1 (or 8).

Within a global batch the layout is rank-major: rank ``r``'s micro-step ``a`` holds positions
``(r·A + a)·B … (r·A + a + 1)·B`` of the global batch.

Loss normalisation: each micro-batch has exactly ``B`` samples and its loss is the *mean* over
them; :class:`~gpu_training.amp.MixedPrecisionStepper` divides each micro-batch loss by ``A``
before ``backward``, and DDP averages gradients over the ``W`` ranks. The gradient applied
is therefore ``1/W · Σ_ranks 1/A · Σ_micro 1/B · Σ_samples ∇ℓ = 1/G · Σ_global batch ∇ℓ``:
the mean over the global batch, whatever the split. (Unequal micro-batches would break this;
the sampler never yields one.) With masked targets the micro-batches hold unequal numbers of
*scored* targets, so a mean per micro-batch breaks it again: the Trainer then divides a
summed loss by the global batch's count instead (:mod:`gpu_training.step`).

Use it as a DataLoader's ``batch_sampler``::

    sampler = GlobalBatchSampler(len(dataset), global_batch_size=256,
                                 per_device_batch_size=32, ctx=ctx, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=0)
    stepper = MixedPrecisionStepper(optimizer,
                                    grad_accum_steps=sampler.gradient_accumulation_steps)
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)          # keeps the position when resuming this epoch
        ...                               # train; save sampler.state_dict() with the model

Resuming: ``sampler.load_state_dict(state)`` restores the epoch and the number of global steps
already taken in it; the next ``__iter__`` continues from there. With ``num_workers > 0`` the
DataLoader fetches batches ahead of training, so :attr:`GlobalBatchSampler.position` runs
ahead too: call ``sampler.set_position(steps_done_in_epoch)`` before saving.

Example:
    >>> from gpu_training.ddp import DistributedContext
    >>> rank1_of_2 = DistributedContext(rank=1, local_rank=1, world_size=2, local_world_size=2)
    >>> sampler = GlobalBatchSampler(10, global_batch_size=8, per_device_batch_size=2,
    ...                              ctx=rank1_of_2, shuffle=False)
    >>> sampler.gradient_accumulation_steps, sampler.steps_per_epoch
    (2, 1)
    >>> list(sampler)  # samples 4..7 of global batch 0..7; 8 and 9 are the dropped tail
    [[4, 5], [6, 7]]
    >>> global_batch_plan(96, per_device_batch_size=8, world_size=4)
    3
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import Sampler

from gpu_training.config import ConfigError
from gpu_training.config.batch import exact_accumulation_steps
from gpu_training.config.checks import check_positive_int_argument
from gpu_training.dist_init import DistributedContext

__all__ = ["GlobalBatchSampler", "SamplerConfigError", "global_batch_plan"]

_MASK64 = (1 << 64) - 1


class SamplerConfigError(ConfigError):
    """The global batch, per-device batch, world size or dataset size do not fit together.

    The message is one line naming the numbers and what would fit.
    """


def _check_positive(name: str, value: object) -> int:
    return check_positive_int_argument(name, value, error=SamplerConfigError)


def global_batch_plan(global_batch_size: int, per_device_batch_size: int, world_size: int) -> int:
    """Accumulation steps ``A`` so that ``world_size × per_device_batch_size × A`` is exactly G.

    The sampler-side twin of :func:`gpu_training.config.global_batch_plan` (the same split,
    :func:`~gpu_training.config.batch.exact_accumulation_steps`, raising
    :class:`SamplerConfigError`). Unlike
    :func:`gpu_training.config.gradient_accumulation_for_target`, which rounds up, this insists
    on an exact split: the global batch is the job's definition.

    Raises:
        SamplerConfigError: If an argument is not a positive integer, or the global batch does
            not split evenly (the message suggests global and per-device batches that do).

    Example:
        >>> global_batch_plan(64, per_device_batch_size=8, world_size=2)
        4
    """
    g = _check_positive("global_batch_size", global_batch_size)
    b = _check_positive("per_device_batch_size", per_device_batch_size)
    w = _check_positive("world_size", world_size)
    return exact_accumulation_steps(g, b, w, error=SamplerConfigError)


_ROWS_PER_CHUNK = 1 << 16
"""Sample indexes turned into a Python list at once (whole global batches; at least one)."""


def _epoch_seed(seed: int, epoch: int) -> int:
    """A 64-bit generator seed from (seed, epoch), via splitmix64.

    Mixed rather than added: with ``seed + epoch``, seed 0 epoch 1 would replay seed 1 epoch 0.
    """
    x = (seed * 0x9E3779B97F4A7C15 + epoch) & _MASK64
    for _ in range(2):
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        x = z ^ (z >> 31)
    return x


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches of a world-size-invariant sequence of global batches.

    Per epoch: a permutation of ``range(num_samples)`` from a private ``torch.Generator``
    seeded with ``(seed, epoch)`` (the global RNG is never touched), cut into
    ``steps_per_epoch`` global batches of ``global_batch_size``; for each, this rank yields
    ``gradient_accumulation_steps`` lists of ``per_device_batch_size`` indices.

    Iteration rules (like :class:`~torch.utils.data.DistributedSampler`, the epoch only
    changes through :meth:`set_epoch`):

    * ``__iter__`` starts at :attr:`position`: after :meth:`load_state_dict` or
      :meth:`set_position` at the restored step, after an abandoned iteration at the first
      global step this rank did not finish.
    * Once an iteration has run through the whole epoch, the next ``__iter__`` without
      :meth:`set_epoch` replays the same epoch from step 0 (same order: call ``set_epoch``).
      A *restored* position at the end of the epoch yields nothing, so resuming from a
      checkpoint taken after the epoch's last step does not repeat the epoch.
    * Use one iterator at a time; starting a new one detaches the old one from
      :attr:`position`.

    Args:
        num_samples: Size of the dataset.
        global_batch_size: Samples per optimizer step over all ranks (``G``).
        per_device_batch_size: Samples per micro-batch on one rank (``B``).
        ctx: This process's rank and world size (default: ``DistributedContext.from_env()``);
            under tensor parallel its data-parallel view
            (:func:`~gpu_training.strategy.data_parallel_context`), so a TP group reads one
            replica's samples.
        seed: Seed of the per-epoch permutations; the same on every rank.
        shuffle: Permute each epoch; False keeps dataset order (still cut into global batches).

    Raises:
        SamplerConfigError: If a size is not a positive integer, ``G > num_samples``, or ``G``
            is not a multiple of ``world_size × B`` (the message says what would fit).

    Example:
        >>> from gpu_training.ddp import DistributedContext
        >>> sampler = GlobalBatchSampler(20, 8, 4, DistributedContext(), seed=1)
        >>> batches = iter(sampler)
        >>> first_step = [next(batches), next(batches)]  # A = 2 micro-batches of 4
        >>> sampler.position, len(sampler)
        (1, 2)
        >>> state = sampler.state_dict()
        >>> resumed = GlobalBatchSampler(20, 8, 8, DistributedContext(), seed=1)  # A = 1
        >>> resumed.load_state_dict(state)
        >>> sorted(next(iter(resumed))) == sorted(next(batches) + next(batches))
        True
    """

    def __init__(
        self,
        num_samples: int,
        global_batch_size: int,
        per_device_batch_size: int,
        ctx: DistributedContext | None = None,
        *,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        super().__init__()
        self._ctx = DistributedContext.from_env() if ctx is None else ctx
        n = _check_positive("num_samples", num_samples)
        g = _check_positive("global_batch_size", global_batch_size)
        b = _check_positive("per_device_batch_size", per_device_batch_size)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SamplerConfigError(f"seed must be an integer, got {seed!r}")
        if g > n:
            raise SamplerConfigError(
                f"global batch {g} is larger than the dataset ({n} samples): an epoch would "
                f"have no step; use a global batch of at most {n}"
            )
        w = self._ctx.world_size
        accum = exact_accumulation_steps(g, b, w, error=SamplerConfigError, max_global_batch=n)
        self._num_samples = n
        self._global_batch_size = g
        self._per_device_batch_size = b
        self._accum = accum
        self._seed = seed
        self._shuffle = bool(shuffle)
        self._epoch = 0
        self._position = 0
        self._replay = False  # True once an iteration ran through the epoch's last step
        self._iteration = 0  # id of the iterator allowed to move `position`
        self._perm_cache: tuple[int, torch.Tensor] | None = None

    # --- read-only description --------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """Size of the dataset."""
        return self._num_samples

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self._global_batch_size

    @property
    def per_device_batch_size(self) -> int:
        """Samples per micro-batch on one rank."""
        return self._per_device_batch_size

    @property
    def world_size(self) -> int:
        """Number of ranks the global batch is split across."""
        return self._ctx.world_size

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._ctx.rank

    @property
    def seed(self) -> int:
        """Seed of the per-epoch permutations."""
        return self._seed

    @property
    def shuffle(self) -> bool:
        """Whether each epoch is permuted."""
        return self._shuffle

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per global step on this rank: ``G / (world_size × B)``."""
        return self._accum

    @property
    def steps_per_epoch(self) -> int:
        """Global (optimizer) steps in one epoch: ``num_samples // G``."""
        return self._num_samples // self._global_batch_size

    # --- position ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch whose permutation is drawn."""
        return self._epoch

    @property
    def position(self) -> int:
        """Global steps of the current epoch already consumed (0 … ``steps_per_epoch``).

        A step counts once this rank's last micro-batch of it has been yielded. Exact with
        ``num_workers=0``; DataLoader workers fetch ahead, so then set it with
        :meth:`set_position` before saving.
        """
        return self._position

    @position.setter
    def position(self, step: int) -> None:
        self.set_position(step)

    def set_position(self, step: int) -> None:
        """Declare that ``step`` global steps of the current epoch are done.

        The next ``__iter__`` starts at global step ``step``. Call it with the number of
        optimizer steps taken this epoch before saving when DataLoader workers prefetch.

        Args:
            step: Global steps already taken in the current epoch.

        Raises:
            ValueError: If ``step`` is not an integer in ``[0, steps_per_epoch]``.
        """
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"position must be an integer, got {step!r}")
        if not 0 <= step <= self.steps_per_epoch:
            raise ValueError(
                f"position must be in [0, {self.steps_per_epoch}] (steps per epoch), got {step}"
            )
        self._position = step
        self._replay = False
        self._iteration += 1  # a live iterator must not overwrite what the caller declared

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; a different epoch starts at position 0.

        Setting the epoch it already has keeps the position, so a resumed run can call
        ``set_epoch(epoch)`` at the top of its loop as usual.

        Args:
            epoch: Epoch number (>= 0).

        Raises:
            ValueError: If ``epoch`` is not a non-negative integer.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
        if epoch != self._epoch:
            self._epoch = epoch
            self._position = 0
            self._replay = False
            self._iteration += 1

    # --- iteration --------------------------------------------------------------------------

    def _start_step(self) -> int:
        if self._replay and self._position >= self.steps_per_epoch:
            return 0
        return self._position

    def _permutation(self) -> torch.Tensor:
        if self._perm_cache is not None and self._perm_cache[0] == self._epoch:
            return self._perm_cache[1]
        if self._shuffle:
            # A private generator: drawing from the global RNG would shift every later
            # random op (dropout, init) depending on how many epochs were sampled.
            generator = torch.Generator()
            generator.manual_seed(_epoch_seed(self._seed, self._epoch))
            perm = torch.randperm(self._num_samples, generator=generator)
        else:
            perm = torch.arange(self._num_samples)
        self._perm_cache = (self._epoch, perm)
        return perm

    def __len__(self) -> int:
        """Micro-batches the next ``__iter__`` yields on this rank (the rest of the epoch)."""
        return (self.steps_per_epoch - self._start_step()) * self._accum

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's micro-batches from :attr:`position` to the end of the epoch."""
        start = self._start_step()
        self._position = start
        self._replay = False
        self._iteration += 1
        return self._micro_batches(start, self._iteration)

    def _micro_batches(self, start: int, iteration: int) -> Iterator[list[int]]:
        perm = self._permutation()
        g, b, accum = self._global_batch_size, self._per_device_batch_size, self._accum
        steps = self.steps_per_epoch
        rank_offset = self.rank * accum * b
        span = max(1, _ROWS_PER_CHUNK // g)  # steps per chunk
        rows: list[int] = []
        base = 0
        for step in range(start, steps):
            if (step - start) % span == 0:
                # A chunk of steps as a list at once: a micro-batch is then a list slice, not
                # a tensor op and a tolist per micro-batch (it shows on small steps).
                base = step * g
                rows = perm[base : base + span * g].tolist()
            first = step * g + rank_offset - base
            for micro in range(accum):
                batch = rows[first + micro * b : first + (micro + 1) * b]
                if micro == accum - 1 and iteration == self._iteration:
                    # Count the step before yielding its last micro-batch: the caller saves
                    # after training on it, without fetching another batch first.
                    self._position = step + 1
                    self._replay = step + 1 == steps
                yield batch

    # --- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """The resumable state, free of world size and per-device batch.

        Returns:
            Plain ints: ``epoch``, ``position`` (global steps done in the epoch), ``seed``,
            ``num_samples``, ``global_batch_size`` and ``shuffle`` (0 or 1).
        """
        return {
            "epoch": self._epoch,
            "position": self._position,
            "seed": self._seed,
            "num_samples": self._num_samples,
            "global_batch_size": self._global_batch_size,
            "shuffle": int(self._shuffle),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the sequence of global batches a :meth:`state_dict` describes.

        Works when this job has another world size or per-device batch: only the dataset
        size, the global batch, the seed and the shuffle flag must match.

        Args:
            state: A dict from :meth:`state_dict` (values may be ints or 0-d tensors).

        Raises:
            ValueError: If a key is missing, a defining field differs from this sampler's
                (the message names the field and both values), or epoch/position are out
                of range.
        """
        values: dict[str, int] = {}
        for key in ("epoch", "position", "seed", "num_samples", "global_batch_size"):
            if key not in state:
                raise ValueError(f"sampler state has no {key!r} (keys: {sorted(state)})")
            values[key] = int(state[key])
        expected = {
            "num_samples": self._num_samples,
            "global_batch_size": self._global_batch_size,
            "seed": self._seed,
        }
        if "shuffle" in state:  # absent in hand-written states: nothing to compare
            values["shuffle"] = int(state["shuffle"])
            expected["shuffle"] = int(self._shuffle)
        for key, mine in expected.items():
            if values[key] != mine:
                raise ValueError(
                    f"sampler state does not match: {key} is {values[key]} in the saved state "
                    f"but {mine} here; resuming would not continue the same global batches"
                )
        if values["epoch"] < 0:
            raise ValueError(f"sampler state: epoch must be >= 0, got {values['epoch']}")
        if not 0 <= values["position"] <= self.steps_per_epoch:
            raise ValueError(
                f"sampler state: position must be in [0, {self.steps_per_epoch}], "
                f"got {values['position']}"
            )
        self._epoch = values["epoch"]
        self._position = values["position"]
        self._replay = False
        self._iteration += 1
