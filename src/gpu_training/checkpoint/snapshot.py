"""A private CPU copy of a state, so that an asynchronous save can write it in the background."""

from __future__ import annotations

import copy
import ctypes
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["snapshot_state"]

# ----------------------------------------------------------------------------------------------
# asynchronous saves: a private CPU snapshot, written by a background thread

_IMMUTABLE = (str, bytes, int, float, complex, type(None), torch.dtype, torch.device, torch.Size)


StagingBuffers = dict[tuple[int, bool], list[torch.UntypedStorage]]
"""Host buffers of a snapshot by (bytes, pinned), to be refilled by the next one."""


class Snapshot:
    """Copies one state, remembering the tensors and storages already copied.

    Args:
        spares: Host buffers of an earlier snapshot that nothing uses any more: refilling
            them skips the page faults of fresh memory, which cost more than the copy
            (benchmarks/README.md, ``bench_checkpoint.py``).
    """

    def __init__(self, spares: StagingBuffers | None = None) -> None:
        self.spares = spares if spares is not None else {}
        self.buffers: StagingBuffers = {}  # the host buffers this snapshot copied into
        self.tensors: dict[int, torch.Tensor] = {}  # id(original) -> copy: one object stays one
        self.storages: dict[tuple[int, int, str], torch.UntypedStorage] = {}
        self.devices: set[torch.device] = set()  # GPUs with copies in flight

    def run(self, state: Any) -> Any:
        """The copy of ``state``, once every device-to-host copy has landed."""
        out = self.tree(state)
        for device in self.devices:  # the copies were queued without blocking
            torch.cuda.synchronize(device)
        return out

    def _buffer(self, nbytes: int, pinned: bool) -> torch.Tensor:
        spares = self.spares.get((nbytes, pinned))
        if spares:
            storage = spares.pop()
        else:
            storage = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).untyped_storage()
        self.buffers.setdefault((nbytes, pinned), []).append(storage)
        return torch.empty(0, dtype=torch.uint8).set_(storage)

    def tree(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            done = self.tensors.get(id(obj))
            if done is None:
                done = self.tensors[id(obj)] = self.tensor(obj)
            return done
        if isinstance(obj, _IMMUTABLE):
            return obj
        if isinstance(obj, Mapping):
            items = [(k, self.tree(v)) for k, v in obj.items()]
            if not isinstance(obj, OrderedDict):
                return dict(items)  # as strip_wrapper_prefixes would make it
            out: OrderedDict[Any, Any] = OrderedDict(items)
            meta = getattr(obj, "_metadata", None)
            if meta is not None:  # module versions, read by load_state_dict
                out._metadata = copy.deepcopy(meta)  # type: ignore[attr-defined]
            return out
        if type(obj) in (list, tuple):
            return type(obj)(self.tree(v) for v in obj)
        return copy.deepcopy(obj)

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU copy of ``t``; tensors sharing a storage get copies sharing one storage."""
        if type(t) is torch.nn.Parameter:  # torch.save records a Parameter as one: so do we
            return torch.nn.Parameter(self.tensor(t.detach()), t.requires_grad)
        requires_grad = t.requires_grad  # torch.save records the flag too
        t = t.detach()
        if (
            type(t) is not torch.Tensor
            or t.layout != torch.strided
            or t.is_quantized
            or t.is_conj()
            or t.is_neg()
            or t.device.type not in ("cpu", "cuda")
        ):
            # subclasses, sparse, quantized...: a plain copy
            return t.to("cpu", copy=True).requires_grad_(requires_grad)
        source = t.untyped_storage()
        key = (source.data_ptr(), source.nbytes(), str(t.device))
        copied = self.storages.get(key)
        if copied is None:
            cuda = t.device.type == "cuda"
            # pinned host memory: the device-to-host copy is one DMA, no staging buffer
            buffer = self._buffer(source.nbytes(), pinned=cuda)
            if cuda:
                whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(source)
                buffer.copy_(whole, non_blocking=True)
                self.devices.add(t.device)
            elif source.nbytes():
                # one memcpy, GIL released: copy_ splits over OpenMP threads, whose barrier
                # spins when ranks x threads exceed the cores (several times slower)
                ctypes.memmove(buffer.data_ptr(), source.data_ptr(), source.nbytes())
            copied = self.storages[key] = buffer.untyped_storage()
        # whole storages, as torch.save writes them: tied weights stay tied, same bytes
        out = torch.empty(0, dtype=t.dtype).set_(copied, t.storage_offset(), t.shape, t.stride())
        return out.requires_grad_(requires_grad)


def snapshot_state(state: Any) -> Any:
    """A copy of ``state`` that later changes to the original cannot reach, on the CPU.

    Dicts, ``OrderedDict`` (with its ``_metadata``), lists and tuples are rebuilt; every
    tensor is copied to CPU memory (pinned when it lives on a GPU, and the call returns once
    the copies have landed), keeping storage sharing so tied weights stay tied; anything else
    is deep-copied. This is what an asynchronous :meth:`CheckpointManager.save` blocks for.

    Args:
        state: A (nested) state dict.

    Returns:
        The copy.

    Example:
        >>> w = torch.zeros(2)
        >>> snap = snapshot_state({"w": w})
        >>> w += 1
        >>> snap["w"].tolist()
        [0.0, 0.0]
    """
    return Snapshot().run(state)
