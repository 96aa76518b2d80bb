"""The per-step NaN/Inf check of a guarded stepper, at the least host cost it can have.

:class:`~gpu_training.amp.MixedPrecisionStepper` built with ``max_nonfinite_steps`` asks a
:class:`NonFiniteGuard` at each optimizer step whether any gradient holds a NaN/Inf. The
answer must be the same on every rank (the step is skipped on all of them or none) and must
not cost the step a host sync it did not have. Two ways, chosen per step:

- **At once** (the CPU, fused optimizer or not; elsewhere a non-fused optimizer; FSDP2): the
  flag is read on the host before the optimizer step, which is then not called. It is the
  global gradient norm's finiteness where the step measures the norm anyway (clipping;
  FSDP2's norm is a collective, the same on every rank), else one fused finiteness check over the optimizer's gradients (after
  DDP's all-reduce they are the same on every rank) — no norm pass nobody asked for.
- **A step later** (a CUDA optimizer that skips on the device: ``fused=True`` Adam/AdamW/SGD,
  what the Trainer builds on a GPU): the flag stays on the GPU and is handed to the fused
  kernel as ``found_inf``, which skips the update (weight decay and step count included) on
  the device, as a loss scaler does. The flag, which ranks' losses were non-finite and which
  gradients were, go to pinned host memory behind a CUDA event, read at the next step's
  optimizer step, when the device is long past them: the host never waits for the step it
  just queued. The diagnosis (:class:`~gpu_training.nonfinite.NonFiniteStep`, its
  ``steps_ago`` is 1) and the stop at the limit come one step later; the weights are never
  touched by a non-finite step either way.

Every rank takes the same way (the device and optimizer are the same on all) and reads its
flag at the same step, so the diagnosis's all-gather (:func:`~gpu_training.nonfinite.gather_flags`)
is reached by all ranks together.

Example:
    >>> import torch
    >>> guard = NonFiniteGuard()
    >>> guard.record_loss(torch.tensor(float("nan")))
    >>> bool(guard.flags_now(None, [torch.ones(2), torch.tensor([1.0, float("inf")])]))
    True
    >>> guard.take_losses_bad()
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DeferredFlags", "NonFiniteGuard", "defers_on_device"]


def defers_on_device(
    optimizer: torch.optim.Optimizer, grads: list[torch.Tensor], *, on_cpu: bool = False
) -> bool:
    """Whether the guard's flag can stay on the device for this step: an optimizer that skips
    its update on a ``found_inf`` tensor (torch's fused Adam/AdamW/SGD; the Trainer's), over
    plain tensors on an accelerator. On the CPU the flag is on the host already and is read
    at once (the step is then not called), which costs a fraction of the deferred path's
    bookkeeping; ``on_cpu=True`` takes the deferred path there too (how its tests run
    without a GPU)."""
    return (
        bool(getattr(optimizer, "_step_supports_amp_scaling", False))
        and bool(grads)
        and (on_cpu or grads[0].device.type != "cpu")
        and not hasattr(grads[0], "full_tensor")  # an FSDP2 DTensor: its norm is the flag
    )


@dataclass
class DeferredFlags:
    """One step's flags on their way to the host: read at the next optimizer step."""

    host: torch.Tensor
    """``[step non-finite, this rank's loss non-finite, per-gradient non-finite...]``
    (pinned host memory, filled by a non-blocking copy)."""

    ready: torch.cuda.Event | None
    """Recorded after the copy (None on the CPU: the copy is done)."""

    owners: list[torch.nn.Parameter]
    """The parameters of the gradients, in the order of the flags."""

    def read(self) -> tuple[bool, bool, list[torch.nn.Parameter]]:
        """``(step non-finite, this rank's loss non-finite, parameters with non-finite
        gradients)``; waits only for the step these flags belong to."""
        if self.ready is not None:
            self.ready.synchronize()
        values = self.host.tolist()
        bad = [p for p, flag in zip(self.owners, values[2:], strict=True) if flag]
        return bool(values[0]), bool(values[1]), bad


class NonFiniteGuard:
    """This rank's NaN/Inf check: the losses it saw and the step's gradient flag."""

    def __init__(self) -> None:
        self._losses: list[torch.Tensor] = []
        self._groups_key: tuple[int, ...] = ()
        self._groups: list[list[int]] = []
        # per (device, dtype): the found flag and the 1.0 the check "unscales" by, reused
        self._found: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self._zeroed: set[tuple[torch.device, torch.dtype]] = set()  # flags read as 0.0 since
        self._used: list[tuple[torch.device, torch.dtype]] = []  # the last call's flags
        self.pending: DeferredFlags | None = None
        """The last step's flags when they were left on the device (read at the next step)."""

    def record_loss(self, loss: torch.Tensor) -> None:
        """Keep a micro-batch's loss (no device op: it is looked at only on a skip)."""
        self._losses.append(loss.detach() if loss.requires_grad else loss)

    def losses_bad(self) -> torch.Tensor:
        """Whether any recorded loss of this step is non-finite, as a 0-d bool tensor; the
        record is cleared."""
        losses, self._losses = self._losses, []
        if not losses:
            return torch.zeros((), dtype=torch.bool)
        return ~torch.isfinite(torch.stack([loss.float().reshape(()) for loss in losses])).all()

    def forget_losses(self) -> None:
        """Drop the recorded losses (a step that was not skipped)."""
        self._losses = []

    def take_losses_bad(self) -> bool:
        """:meth:`losses_bad` read on the host (one sync: for a skipped step only)."""
        return bool(self.losses_bad())

    def flags_now(
        self,
        norm: torch.Tensor | None,
        grads: list[torch.Tensor],
        owners: list[torch.nn.Parameter] | None = None,
    ) -> torch.Tensor:
        """The step's flag as a 0-d tensor on the gradients' device, true (nonzero) when a
        gradient holds a NaN/Inf. Valid until the next call (its buffer is reused).

        ``norm``: the global gradient norm when the step measured it (clipping, FSDP2), the
        same on every rank; else ``grads``, the optimizer's gradients, checked in one fused
        pass per device and dtype (the op a loss scaler uses to find an overflow);
        ``owners``: their parameters (the grouping by device and dtype is cached on them).
        """
        self._used = []  # before any return: only this call's flags may be marked zeroed
        if norm is not None:
            full = getattr(norm, "full_tensor", None)  # FSDP2: a replicated DTensor
            value = full() if callable(full) else norm
            return ~torch.isfinite(value.detach())
        if not grads:
            return torch.zeros((), dtype=torch.bool)
        founds = []
        for indexes in self._grouped(grads, owners):
            group = [grads[i] for i in indexes]
            key = (group[0].device, group[0].dtype)
            if key not in self._found:
                self._found[key] = (torch.zeros((), device=key[0]), torch.ones((), device=key[0]))
            found, one = self._found[key]
            if key in self._zeroed:  # read as 0.0 and not written since: no op to zero it
                self._zeroed.discard(key)
            else:
                found.zero_()
            self._used.append(key)
            # Multiplies by 1.0 (a no-op on the values) and sets found when any is NaN/Inf.
            torch._amp_foreach_non_finite_check_and_unscale_(group, found, one)
            founds.append(found)
        if len(founds) == 1:
            return founds[0]  # 1.0 or 0.0: its truth is the flag (one op less than a > 0)
        return torch.stack([f.to(founds[0].device) for f in founds]).sum()

    def nonfinite_now(
        self,
        norm: torch.Tensor | None,
        grads: list[torch.Tensor],
        owners: list[torch.nn.Parameter] | None = None,
    ) -> bool:
        """:meth:`flags_now` read on the host (one sync). A finite step leaves its flags at
        0.0, known on the host, so the next step's check does not zero them first."""
        nonfinite = bool(self.flags_now(norm, grads, owners))
        if not nonfinite and norm is None:
            self._zeroed.update(self._used)
        return nonfinite

    def defer(
        self,
        norm: torch.Tensor | None,
        grads: list[torch.Tensor],
        owners: list[torch.nn.Parameter],
    ) -> torch.Tensor:
        """Leave the step's flag on the device: returns ``found_inf`` (0-d float32) for the
        fused optimizer, and sends the flags to the host behind an event (:attr:`pending`).

        One pass over ``grads`` (a norm per gradient, which also names the first non-finite
        one); ``norm``, the global norm when the step measured it, is the flag then.
        """
        bad = ~torch.isfinite(torch.stack(torch._foreach_norm(grads)).float())
        flag = bad.any() if norm is None else ~torch.isfinite(norm.detach())
        found = flag.to(torch.float32).reshape(())
        loss_bad = self.losses_bad().to(found.device, torch.float32).reshape(1)
        packed = torch.cat([found.reshape(1), loss_bad, bad.float()])
        host, ready = packed, None  # on the CPU the values are there already
        if packed.is_cuda:  # pinned: the copy is queued behind the step, the host goes on
            host = torch.empty(packed.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        self.pending = DeferredFlags(host=host, ready=ready, owners=list(owners))
        return found

    def _grouped(
        self, grads: list[torch.Tensor], owners: list[torch.nn.Parameter] | None
    ) -> list[list[int]]:
        """Indexes of ``grads`` by (device, dtype), cached on their parameters: a gradient
        has its parameter's device and dtype (autograd refuses another), so the grouping
        holds while the same parameters have gradients, in the same order."""
        if owners is None:
            key: tuple[int, ...] = ()
        else:
            key = (len(owners), id(owners[0]), id(owners[-1]), *map(id, owners[1:-1:16]))
        if not key or key != self._groups_key:
            groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
            for i, grad in enumerate(grads):
                groups.setdefault((grad.device, grad.dtype), []).append(i)
            self._groups, self._groups_key = list(groups.values()), key
        return self._groups
