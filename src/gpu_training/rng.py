"""Random-number state: seed it, capture it, restore it — on every rank.

Bitwise-exact resume needs every source of randomness a step consumes: torch's CPU and CUDA
generators (dropout, init), Python's ``random`` and NumPy's global state (augmentations), and
the private ``torch.Generator`` objects a run hands its data loaders (each ``iter(DataLoader)``
draws a base seed — from the *global* RNG unless the loader has its own generator).
Ranks draw different random numbers outside the micro-batches, so each rank's state is
saved, not just rank 0's.

Inside a micro-batch's forward and backward, randomness belongs to the *samples*, not to the
rank that computes them: :func:`micro_batch_rng` seeds torch's generators from (seed,
optimizer step, the micro-batch's index in the global batch) and restores them afterwards, so
micro-batch ``k`` of step ``s`` gets the same dropout masks on 1 rank or 8 (promise 1 with
dropout on), and a run resumed at another world size continues exactly.

Everything is stored as tensors, ints, floats and None, so a checkpoint holding it loads with
``torch.load(..., weights_only=True)``.

Example:
    >>> import random, torch
    >>> g = torch.Generator().manual_seed(1)
    >>> state = capture_rng_state({"loader": g})
    >>> a = (torch.rand(2), random.random(), torch.rand(1, generator=g))
    >>> restore_rng_state(state, {"loader": g})
    >>> b = (torch.rand(2), random.random(), torch.rand(1, generator=g))
    >>> torch.equal(a[0], b[0]) and a[1] == b[1] and torch.equal(a[2], b[2])
    True
"""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from gpu_training.ddp import DistributedContext, process_group_up
from gpu_training.process_group import collective_device

__all__ = [
    "capture_rng_state",
    "gather_rng_states",
    "micro_batch_rng",
    "micro_batch_seed",
    "restore_rng_state",
    "seed_everything",
]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def seed_everything(seed: int, *, rank: int = 0) -> None:
    """Seed torch (CPU and CUDA), Python's ``random`` and NumPy with ``seed + rank``.

    Use ``rank=0`` everywhere before building the model (identical initial weights), and
    ``rank=ctx.rank`` afterwards when ranks should draw different random numbers (the guide:
    "set seeds per rank").

    Raises:
        ValueError: If ``seed + rank`` is negative.
    """
    value = seed + rank
    if value < 0:
        raise ValueError(f"seed + rank must be >= 0, got {value}")
    random.seed(value)
    torch.manual_seed(value)  # also seeds every CUDA device
    try:
        import numpy as np
    except ImportError:  # NumPy is optional
        return
    np.random.seed(value % 2**32)


def _mix(x: int, part: int) -> int:
    """One splitmix64 round of ``part`` into ``x``."""
    x = (x ^ (part & _MASK64)) & _MASK64
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


_BLOCK = 1024
"""Steps per table of seeds: :func:`micro_batch_seed` computes a block of steps at once."""
_TABLES: dict[tuple[int, int], tuple[int, list[int]]] = {}


def _vector_mix(x: Any, part: Any) -> Any:
    """:func:`_mix` over NumPy uint64 arrays (their arithmetic wraps modulo 2**64, as the
    masks do)."""
    import numpy as np

    x = (x ^ part) + np.uint64(_GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _seed_block(seed: int, first: int, index: int) -> list[int]:
    """``micro_batch_seed(seed, step, index)`` for ``first <= step < first + _BLOCK``."""
    try:
        import numpy as np
    except ImportError:  # NumPy is optional: the same values, one at a time
        return [
            _mix(_mix(_mix(0, seed), step), index) >> 1 for step in range(first, first + _BLOCK)
        ]
    prefix = np.full(_BLOCK, _mix(0, seed), dtype=np.uint64)
    steps = np.arange(_BLOCK, dtype=np.uint64) + np.uint64(first & _MASK64)
    values = _vector_mix(_vector_mix(prefix, steps), np.uint64(index & _MASK64))
    return (values >> np.uint64(1)).tolist()


def micro_batch_seed(seed: int, step: int, index: int) -> int:
    """A 63-bit generator seed for micro-batch ``index`` of optimizer step ``step``.

    splitmix64 over the three numbers, so nearby (seed, step, index) give unrelated streams
    (``seed + step`` would make seed 0 step 1 replay seed 1 step 0). Called once per
    micro-batch, so the values come from a table of the next 1,024 steps per (seed, index),
    computed at once in NumPy: the same numbers as the scalar splitmix64 in Python, which
    cost a tiny step's loop several microseconds.

    Args:
        seed: The run's seed.
        step: Optimizer steps completed before this one (``>= 0``).
        index: The micro-batch's place in the global batch (rank-major: ``rank * A + micro``).

    Returns:
        A non-negative seed for ``torch.Generator.manual_seed``.

    Example:
        >>> micro_batch_seed(0, 0, 1) != micro_batch_seed(0, 1, 0)
        True
    """
    if step < 0 or step > _MASK64:
        return _mix(_mix(_mix(0, seed), step), index) >> 1
    offset = step % _BLOCK
    first = step - offset
    key = (seed, index)
    table = _TABLES.get(key)
    if table is None or table[0] != first:
        if len(_TABLES) >= 256:  # many indices or seeds: keep the memory bounded
            _TABLES.clear()
        table = _TABLES[key] = (first, _seed_block(seed, first, index))
    return table[1][offset]


class _MicroBatchStream:
    """The context :func:`micro_batch_rng` returns: a class, not a generator function, as it
    is entered once per micro-batch (the contextmanager machinery cost as much as the swap)."""

    __slots__ = ("_cpu_state", "_cuda", "_cuda_state", "_value")

    def __init__(self, value: int, cuda: torch.Generator | None) -> None:
        self._value = value
        self._cuda = cuda
        self._cpu_state: torch.Tensor | None = None
        self._cuda_state: torch.Tensor | None = None

    def __enter__(self) -> None:
        self._cpu_state = torch.default_generator.get_state()
        torch.default_generator.manual_seed(self._value)
        if self._cuda is not None:
            self._cuda_state = self._cuda.get_state()
            self._cuda.manual_seed(self._value)

    def __exit__(self, *exc: object) -> None:
        if self._cpu_state is not None:
            torch.default_generator.set_state(self._cpu_state)
        if self._cuda is not None and self._cuda_state is not None:
            self._cuda.set_state(self._cuda_state)


def micro_batch_rng(
    seed: int, step: int, index: int, device: torch.device | str | None = None
) -> contextlib.AbstractContextManager[None]:
    """Draws inside come from the micro-batch's own stream; the previous state comes back after.

    Wrap a micro-batch's forward *and* backward (activation checkpointing recomputes the
    forward in backward: ``torch.utils.checkpoint`` replays the state it saw in forward, so
    the recomputed masks are the same). Seeds torch's CPU generator and, for a CUDA
    ``device``, that device's generator; Python's ``random`` and NumPy are left alone.

    Args:
        seed: The run's seed.
        step: Optimizer steps completed before this one.
        index: The micro-batch's place in the global batch: with the global-batch sampler's
            rank-major layout, ``rank * accumulation_steps + micro_step``. The same index
            holds the same samples on any world size when the per-device batch is the same.
        device: The device the forward runs on (default: CPU only).

    Returns:
        A context manager (enter it once).

    Example:
        >>> import torch
        >>> with micro_batch_rng(0, step=3, index=1):
        ...     a = torch.rand(2)
        >>> with micro_batch_rng(0, step=3, index=1):
        ...     b = torch.rand(2)
        >>> torch.equal(a, b)
        True
    """
    cuda = None
    if device is not None and getattr(device, "type", device) != "cpu":
        dev = torch.device(device)
        if dev.type == "cuda":
            cuda = torch.cuda.default_generators[
                torch.cuda.current_device() if dev.index is None else dev.index
            ]
    return _MicroBatchStream(micro_batch_seed(seed, step, index), cuda)


def _numpy_state() -> dict[str, Any] | None:
    try:
        import numpy as np
    except ImportError:
        return None
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    if kind != "MT19937":  # pragma: no cover - NumPy's legacy global state is always MT19937
        return None
    return {
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def capture_rng_state(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """This process's RNG state, as plain tensors and numbers.

    Args:
        generators: Named private generators to include (e.g. a DataLoader's ``generator``).

    Returns:
        A dict with ``torch``, ``cuda`` (a list, empty without CUDA), ``python``, ``numpy``
        (None without NumPy) and ``generators``.
    """
    version, internal, gauss_next = random.getstate()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {
        "torch": torch.get_rng_state(),
        "cuda": list(cuda),
        "python": {
            "version": int(version),
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
        "numpy": _numpy_state(),
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }


def restore_rng_state(
    state: Mapping[str, Any],
    generators: Mapping[str, torch.Generator] | None = None,
    *,
    global_state: bool = True,
) -> None:
    """Restore what :func:`capture_rng_state` captured.

    Args:
        state: A captured state (e.g. from a checkpoint loaded with ``weights_only=True``).
        generators: The same named generators that were captured; each is restored in place.
        global_state: Also restore torch, CUDA, Python and NumPy global states (False: only
            the named generators).

    Raises:
        KeyError: If a generator to restore is missing from ``state``.
    """
    saved = state.get("generators") or {}
    for name, generator in (generators or {}).items():
        if name not in saved:
            raise KeyError(f"no saved state for generator {name!r} (saved: {sorted(saved)})")
        generator.set_state(saved[name])
    if not global_state:
        return
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        count = min(len(cuda), torch.cuda.device_count())
        torch.cuda.set_rng_state_all(list(cuda)[:count])
    py = state["python"]
    random.setstate(
        (py["version"], tuple(int(v) for v in py["internal"].tolist()), py["gauss_next"])
    )
    np_state = state.get("numpy")
    if np_state is not None:
        try:
            import numpy as np
        except ImportError:
            np = None  # type: ignore[assignment]
        if np is not None:
            np.random.set_state(
                (
                    "MT19937",
                    np_state["keys"].numpy().astype(np.uint32),
                    np_state["pos"],
                    np_state["has_gauss"],
                    np_state["cached_gaussian"],
                )
            )


def _to_bytes(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def gather_rng_states(
    ctx: DistributedContext, generators: Mapping[str, torch.Generator] | None = None
) -> list[dict[str, Any]] | None:
    """Every rank's RNG state, gathered to rank 0. A collective: every rank must call it.

    Args:
        ctx: This process's context.
        generators: Named private generators to include (the same names on every rank).

    Returns:
        On rank 0, one state per rank (index = rank); None on the other ranks.
    """
    local = capture_rng_state(generators)
    if not (ctx.is_distributed and process_group_up()):
        return [local]
    device = collective_device()
    payload = _to_bytes(local).to(device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(ctx.world_size)]
    dist.all_gather(sizes, torch.tensor([payload.numel()], dtype=torch.int64, device=device))
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    chunks = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(ctx.world_size)]
    dist.all_gather(chunks, padded)
    if not ctx.is_main_process:
        return None
    states = []
    for size, chunk in zip(sizes, chunks, strict=True):
        raw = bytes(chunk[: int(size.item())].cpu().tolist())
        # weights_only: the bytes are our own tensors and numbers, never arbitrary objects.
        states.append(torch.load(io.BytesIO(raw), weights_only=True))
    return states
