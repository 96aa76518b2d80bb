"""Live-tensor accounting: which storage a tensor uses, and the live bytes after every operator.

:func:`storage_key` names the storage behind a tensor (views share it), so bytes are counted
once per storage. :class:`LiveTensorTracker`, a ``TorchDispatchMode``, sees every tensor an
operator creates and when its storage dies, so it knows the live bytes after every operator
and their peak: on real tensors and on fake ones (``FakeTensorMode``: metadata only, no
storage). :func:`~gpu_training.memory.measure.profile_step` measures a training step's
transient peaks with it, and :func:`~gpu_training.memory.memory_tracking` uses it on the CPU,
which keeps no allocator statistics. :mod:`gpu_training.memory.measure` re-exports both names.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LiveTensorTracker", "storage_bytes", "storage_key"]


def storage_key(tensor: torch.Tensor) -> int | None:
    """Identity of the storage behind ``tensor`` (views share it), or None if it has none.

    Example:
        >>> t = torch.zeros(4)
        >>> storage_key(t) == storage_key(t[1:])
        True
    """
    try:
        return int(tensor.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return None


def storage_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the whole storage behind ``tensor`` (a view counts its base's storage)."""
    return int(tensor.untyped_storage().nbytes())


class LiveTensorTracker(TorchDispatchMode):
    """Live bytes of the tensors operators create while active, and their peak.

    A tensor's storage counts from the operator that created it until the last tensor using
    it dies (views and in-place results share the count). Tensors that existed before the
    tracker started (parameters, say) are not counted, nor are in-place updates of them.
    Works under ``FakeTensorMode`` as on real tensors; on the CPU it is the only way to see a
    step's peak, since the CPU allocator keeps no statistics. Scratch memory inside a kernel
    (cuBLAS/cuDNN workspaces) is invisible to it.

    Example:
        >>> with LiveTensorTracker() as tracker:
        ...     a = torch.zeros(1024)           # 4 KiB
        ...     b = a * 2                       # 4 KiB more
        ...     del a
        >>> tracker.peak_bytes, tracker.current_bytes
        (8192, 4096)
    """

    def __init__(self) -> None:
        super().__init__()
        self._counts: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._held: set[int] = set()
        # id -> weakref (a set would compare tensors with ==, elementwise).
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}
        self.current_bytes = 0
        """Bytes of tracked storages alive now (held ones excluded)."""
        self.held_bytes = 0
        """Bytes of live storages moved aside with :meth:`hold` (a step's gradients)."""
        self.peak_bytes = 0
        """Most :attr:`current_bytes` at once since the start (or :meth:`reset_peak`)."""
        self.held_at_peak = 0
        """:attr:`held_bytes` when :attr:`peak_bytes` was reached."""
        self.peak_total = 0
        """Most :attr:`current_bytes` + :attr:`held_bytes` at once."""
        self.trace: list[tuple[int, int]] | None = None
        """When a list: ``(current_bytes, held_bytes)`` after every operator is appended."""

    def reset_peak(self) -> None:
        """Start new peaks from the bytes alive now (to measure one phase of a step)."""
        self.peak_bytes = self.current_bytes
        self.held_at_peak = self.held_bytes
        self.peak_total = self.current_bytes + self.held_bytes

    def _update_peaks(self) -> None:
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            self.held_at_peak = self.held_bytes
        self.peak_total = max(self.peak_total, self.current_bytes + self.held_bytes)

    def track(self, tensor: torch.Tensor) -> None:
        """Count an existing tensor as if an operator had just created it (e.g. the inputs)."""
        key = storage_key(tensor)
        if key is None:
            return
        if key not in self._counts:
            self._counts[key] = 0
            self._sizes[key] = storage_bytes(tensor)
            self.current_bytes += self._sizes[key]
            self._update_peaks()
        self._counts[key] += 1
        # PyObject preservation keeps a tensor's Python object alive as long as autograd holds
        # the tensor, so this callback fires when the tensor itself dies, not just its name.
        ref = weakref.ref(tensor, functools.partial(self._release, key))
        self._refs[id(ref)] = ref

    def hold(self, tensor: torch.Tensor) -> None:
        """Move a tracked storage from :attr:`current_bytes` to :attr:`held_bytes`.

        For gradients: sharded strategies free them (reduce-scatter) as backward goes, so the
        backward peak is wanted with and without them.
        """
        key = storage_key(tensor)
        if key is None or key not in self._counts or key in self._held:
            return
        self._held.add(key)
        self.current_bytes -= self._sizes[key]
        self.held_bytes += self._sizes[key]

    def _release(self, key: int, ref: weakref.ref[torch.Tensor]) -> None:
        self._refs.pop(id(ref), None)
        count = self._counts.get(key)
        if count is None:
            return
        if count > 1:
            self._counts[key] = count - 1
            return
        del self._counts[key]
        size = self._sizes.pop(key)
        if key in self._held:
            self._held.discard(key)
            self.held_bytes -= size
        else:
            self.current_bytes -= size

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            storage_key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            key = storage_key(t)
            # An in-place result or a view of a tensor from before tracking is no allocation.
            if key in inputs and key not in self._counts:
                continue
            self.track(t)
        if self.trace is not None:
            self.trace.append((self.current_bytes, self.held_bytes))
        return out
