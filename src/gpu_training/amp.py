"""Mixed precision done in the right order: autocast, loss scaling, unscale → clip → step.

Two mechanisms people conflate: *autocast* (run matmuls in fp16/bf16, keep fp32 master
weights) and *loss scaling* (a numerical workaround that only fp16 needs). One
:class:`MixedPrecisionStepper` hides both behind the same loop body for every precision::

    stepper = MixedPrecisionStepper(optimizer, precision="bf16",
                                    grad_accum_steps=4, max_grad_norm=1.0)
    for micro_step, (x, y) in enumerate(loader):
        with stepper.autocast():
            loss = loss_fn(model(x), y)
        stepper.backward(loss)                             # ÷ accumulation, scale, backward
        grad_norm = stepper.step(model.parameters(), micro_step)  # acts on boundaries only

The guides call it ``MixedPrecisionTrainer``: that name is an alias of the same class.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Literal

import torch

from gpu_training.grad_norm import clip_grad_norm, total_norm
from gpu_training.nonfinite import (
    Names,
    NonFiniteError,
    NonFiniteStep,
    first_nonfinite,
    gather_flags,
    nonfinite_warning,
    parameter_name,
)
from gpu_training.nonfinite_guard import NonFiniteGuard, defers_on_device

__all__ = [
    "GradNorm",
    "MixedPrecisionStepper",
    "MixedPrecisionTrainer",
    "NonFiniteError",
    "NonFiniteStep",
    "Precision",
    "autocast_dtype",
    "needs_grad_scaler",
    "nonfinite_warning",
    "resolve_precision",
    "should_step",
]

Precision = Literal["fp32", "fp16", "bf16"]

_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16}
_KNOWN = ("auto", "fp32", "fp16", "bf16")
_NO_AUTOCAST: contextlib.AbstractContextManager[None] = contextlib.nullcontext()  # reusable


def should_step(micro_step: int, grad_accum_steps: int) -> bool:
    """Whether ``micro_step`` (0-based) closes an accumulation window.

    The single source of truth for "is this the boundary": True after micro-steps
    ``accum-1, 2·accum-1, …``.

    Example:
        >>> [should_step(i, 2) for i in range(4)]
        [False, True, False, True]

    Raises:
        ValueError: If ``grad_accum_steps < 1`` or ``micro_step < 0``.
    """
    if grad_accum_steps < 1:
        raise ValueError(f"grad_accum_steps must be >= 1, got {grad_accum_steps}")
    if micro_step < 0:
        raise ValueError(f"micro_step must be >= 0, got {micro_step}")
    return (micro_step + 1) % grad_accum_steps == 0


def _check_precision(precision: str) -> None:
    if precision not in _KNOWN:
        raise ValueError(f"precision must be one of {', '.join(_KNOWN)}, got {precision!r}")


def needs_grad_scaler(precision: str) -> bool:
    """True only for fp16: bf16 has fp32's exponent range, so its gradients do not underflow.

    Example:
        >>> needs_grad_scaler("fp16"), needs_grad_scaler("bf16")
        (True, False)

    Raises:
        ValueError: For an unknown precision (``"auto"`` must be resolved first).
    """
    _check_precision(precision)
    if precision == "auto":
        raise ValueError("resolve 'auto' with resolve_precision() before asking for a scaler")
    return precision == "fp16"


def resolve_precision(precision: str, device: torch.device | str | None = None) -> Precision:
    """Turn ``"auto"`` into a concrete precision for ``device``.

    ``auto`` picks bf16 on a CUDA device that supports it (Ampere or newer), fp16 on older
    CUDA devices, and fp32 on the CPU (CPU autocast is slower than fp32 for most models; ask
    for ``"bf16"``/``"fp16"`` explicitly to use it there).

    Args:
        precision: ``"auto"``, ``"fp32"``, ``"fp16"`` or ``"bf16"``.
        device: The device training runs on (default: the current CUDA device if any, else CPU).

    Raises:
        ValueError: For an unknown precision, or bf16 requested on a CUDA device without it.
    """
    _check_precision(precision)
    dev = torch.device(device) if device is not None else _default_device()
    if precision == "auto":
        if dev.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "fp32"
    if precision == "bf16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(
            "precision 'bf16' is not supported on this GPU (needs Ampere or newer); use 'fp16'"
        )
    return precision  # type: ignore[return-value]  # narrowed by _check_precision


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype for a resolved precision, or None for fp32."""
    _check_precision(precision)
    return _DTYPES.get(precision)


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _optimizer_device(optimizer: torch.optim.Optimizer) -> torch.device:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return torch.device(p.device)
    return _default_device()


class GradNorm:
    """The gradient norm of one optimizer step, measured on first read.

    :meth:`MixedPrecisionStepper.step_async` returns one on each accumulation boundary.
    Clipping measures the norm anyway, so then it is already there; otherwise nothing is
    computed until :meth:`tensor`, :meth:`item` or ``float()`` asks — a full pass over the
    gradients that a loop which never reads the norm does not pay for. Until then the handle
    keeps the step's gradients (unscaled, before ``zero_grad``) and drops them at the
    stepper's next ``autocast()`` or ``backward()``, so it holds no more memory than the step
    itself did: read it before the next forward. Under FSDP2 the norm is a collective, so it
    is measured at the step, on every rank.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(4, 1)
        >>> stepper = MixedPrecisionStepper(torch.optim.SGD(model.parameters(), lr=0.1), "fp32")
        >>> stepper.backward(model(torch.ones(3, 4)).pow(2).mean())
        >>> norm = stepper.step_async(model.parameters(), 0)
        >>> norm.computed                    # no clipping: nothing measured yet
        False
        >>> norm.item() > 0 and norm.computed
        True
    """

    __slots__ = ("_grads", "_owners", "_params", "_skipped", "_value", "_versions")

    def __init__(self, value: torch.Tensor) -> None:
        self._value: torch.Tensor | None = value
        self._params: Iterable[torch.nn.Parameter] | None = None
        self._owners: list[torch.nn.Parameter] | None = None
        self._grads: list[torch.Tensor] | None = None
        self._versions: list[int] | None = None
        self._skipped = False

    @classmethod
    def _unmeasured(
        cls,
        params: Iterable[torch.nn.Parameter],
        owners: list[torch.nn.Parameter],
        grads: list[torch.Tensor],
        skipped: bool,
    ) -> GradNorm:
        """A norm to measure on read over ``params``, from the optimizer's gradients held.

        ``params`` is not iterated until then (``model.parameters()`` walks every module,
        a cost a loop that never reads the norm should not pay); ``owners[i].grad`` was
        ``grads[i]`` before ``zero_grad``.
        """
        norm = cls.__new__(cls)
        norm._value = None
        norm._params = params
        norm._owners = owners
        norm._grads = grads
        # The version counters before the optimizer step: an in-place change after it (an
        # optimizer that rewrites .grad) would make a later read wrong, so it is refused.
        norm._versions = _versions(grads)
        norm._skipped = skipped
        return norm

    @property
    def computed(self) -> bool:
        """Whether the norm has been measured (at the step when clipping, or by a read)."""
        return self._value is not None

    def tensor(self) -> torch.Tensor:
        """The norm as a 0-d tensor on the gradients' device (``inf`` for a skipped fp16 step).

        Raises:
            RuntimeError: If read after the stepper's next ``autocast()``/``backward()`` (the
                gradients are gone), or if something changed the gradients in place after the
                step (an optimizer that does: pass ``norm=True`` to ``step_async``).
        """
        if self._value is not None:
            return self._value
        if self._grads is None or self._owners is None or self._params is None:
            raise RuntimeError(
                "the gradient norm was not read before the next forward/backward, and the "
                "step's gradients are gone: read it right after step_async, or pass "
                "norm=True to measure it at the step"
            )
        if self._versions != _versions(self._grads):
            raise RuntimeError(
                "the gradients changed in place after the optimizer step (this optimizer "
                "modifies them): pass norm=True to step_async to measure the norm at the step"
            )
        held = {id(p): g for p, g in zip(self._owners, self._grads, strict=True)}
        grads = []
        for p in self._params:
            grad = held.get(id(p), p.grad)  # a parameter outside the optimizer kept its .grad
            if grad is not None:
                grads.append(grad)
        self._value = _finish_norm(total_norm(grads), self._skipped)
        self._release()
        return self._value

    def item(self) -> float:
        """The norm as a Python float (one host sync on a GPU)."""
        return float(self.tensor())

    def __float__(self) -> float:
        return self.item()

    def __repr__(self) -> str:
        if self._value is not None:
            return f"GradNorm({float(self._value):.6g})"
        return "GradNorm(<not measured>)" if self._grads is not None else "GradNorm(<gone>)"

    def _release(self) -> None:
        """Drop the gradients (the stepper calls this at its next autocast or backward)."""
        self._params = self._owners = self._grads = self._versions = None


def _versions(tensors: list[torch.Tensor]) -> list[int]:
    return [t._version for t in tensors]


def _finish_norm(norm: torch.Tensor, skipped: bool) -> torch.Tensor:
    full = getattr(norm, "full_tensor", None)  # FSDP2: a replicated DTensor
    norm = (full() if callable(full) else norm).detach()
    if skipped:
        norm = torch.where(torch.isfinite(norm), torch.full_like(norm, math.inf), norm)
    return norm


class MixedPrecisionStepper:
    """One interface for fp32, fp16 and bf16 steps, with gradient accumulation and clipping.

    Args:
        optimizer: The optimizer to step.
        precision: ``"auto"``, ``"fp32"``, ``"fp16"`` or ``"bf16"`` (see :func:`resolve_precision`).
        grad_accum_steps: Micro-batches per optimizer step; losses are divided by it so the
            accumulated gradient is the mean, not the sum.
        max_grad_norm: Clip the global gradient norm to this value (``None``: no clipping; the
            norm is then measured only when read, see :class:`GradNorm`).
        device: Device whose autocast to use (default: where the optimizer's parameters live).
        max_nonfinite_steps: Skip any step whose gradients hold a NaN/Inf, in every precision,
            on every rank alike, and tell the loop after this many in a row
            (:attr:`nonfinite_in_a_row`; the Trainer then stops). The flag every rank agrees
            on is the global gradient norm's finiteness: after DDP's all-reduce (or FSDP's
            norm all-reduce) every rank holds the same value, and a rank's NaN loss reaches
            its gradients and so every rank's, so no collective is added; the host reads it
            once per step (one sync). On a skip the ranks gather which of them had a
            non-finite loss and the first non-finite gradient (:attr:`last_nonfinite`). In
            fp16 the loss scaler's overflow skips (its calibration) are not counted unless
            a loss was non-finite. ``None``: off (fp16 still skips overflows, as always).
        defer_on_cpu: With a fused optimizer, leave the step's NaN/Inf flag to the
            optimizer and read it a step later on the CPU too, as on a GPU (see
            :mod:`gpu_training.nonfinite_guard`); by default a CPU flag is read at once.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> stepper = MixedPrecisionStepper(opt, precision="fp32", grad_accum_steps=2)
        >>> for micro_step in range(2):
        ...     with stepper.autocast():
        ...         loss = model(torch.ones(3, 4)).pow(2).mean()
        ...     stepper.backward(loss)
        ...     norm = stepper.step(model.parameters(), micro_step)
        >>> norm is not None
        True
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        precision: str = "auto",
        grad_accum_steps: int = 1,
        max_grad_norm: float | None = None,
        device: torch.device | str | None = None,
        max_nonfinite_steps: int | None = None,
        *,
        defer_on_cpu: bool = False,
    ) -> None:
        if grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps must be >= 1, got {grad_accum_steps}")
        if max_nonfinite_steps is not None and max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1 or None, got {max_nonfinite_steps}")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm}")
        self.optimizer = optimizer
        self.device = torch.device(device) if device is not None else _optimizer_device(optimizer)
        self.precision: Precision = resolve_precision(precision, self.device)
        self.grad_accum_steps = grad_accum_steps
        self.max_grad_norm = max_grad_norm
        self._dtype = autocast_dtype(self.precision)
        # Disabled for bf16/fp32 (its state still checkpointed): its calls are no-ops, skipped.
        self._scaler = torch.amp.GradScaler(
            self.device.type, enabled=needs_grad_scaler(self.precision)
        )
        self._scaling = self._scaler.is_enabled()  # else its calls are skipped: each is a no-op
        self.skipped_steps = 0
        self.last_step_skipped = False
        self.max_nonfinite_steps = max_nonfinite_steps
        self.nonfinite_in_a_row = 0
        """Steps in a row skipped for a NaN/Inf (with ``max_nonfinite_steps``)."""
        self.last_nonfinite: NonFiniteStep | None = None
        """The last step's diagnosis when it was skipped for a NaN/Inf, else None."""
        self._guard = NonFiniteGuard() if max_nonfinite_steps is not None else None
        self._defer_on_cpu = defer_on_cpu
        self._names: Names | None = None  # the last step's, to name a gradient found a step later
        self._unread: GradNorm | None = None  # its gradients go at the next forward

    @property
    def scaler(self) -> torch.amp.GradScaler:
        """The underlying GradScaler (disabled unless precision is fp16)."""
        return self._scaler

    @property
    def loss_scale(self) -> float:
        """The current loss-scale factor (1.0 when no scaler is used)."""
        return float(self._scaler.get_scale()) if self._scaler.is_enabled() else 1.0

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` for fp16/bf16, a no-op context for fp32."""
        if self._unread is not None:
            self._drop_unread()
        if self._dtype is None:
            return _NO_AUTOCAST
        return torch.autocast(device_type=self.device.type, dtype=self._dtype)

    def backward(self, loss: torch.Tensor) -> torch.Tensor | None:
        """Divide by the accumulation steps, scale (fp16), and backpropagate.

        Returns ``loss`` detached when the NaN guard keeps it (a loop may keep the same
        tensor instead of detaching it again), else None.
        """
        if self._unread is not None:
            self._drop_unread()
        kept = None
        if self._guard is not None:  # kept, looked at only on a skip
            kept = loss.detach()
            self._guard.record_loss(kept)
        if self.grad_accum_steps > 1:  # x / 1 is x, but costs an op and an autograd node
            loss = loss / self.grad_accum_steps
        (self._scaler.scale(loss) if self._scaling else loss).backward()
        return kept

    def step(
        self,
        params: Iterable[torch.nn.Parameter],
        micro_step: int,
        *,
        names: Names | None = None,
    ) -> float | None:
        """Step the optimizer if ``micro_step`` closes an accumulation window.

        On a boundary, in this order: unscale (so clipping sees true magnitudes), clip,
        optimizer step (skipped by the scaler if a gradient is inf/NaN), scaler update,
        ``zero_grad(set_to_none=True)``.

        Args:
            params: The parameters whose gradients are clipped and measured.
            micro_step: 0-based micro-batch index (see :func:`should_step`).
            names: ``model.named_parameters``, to name a non-finite gradient (see
                :meth:`step_async`).

        Returns:
            The global gradient norm before clipping (``inf``/``nan`` when the fp16 step was
            skipped for overflow), or None off a boundary.
        """
        norm = self.step_async(params, micro_step, norm=True, names=names)
        return None if norm is None else norm.item()

    def step_async(
        self,
        params: Iterable[torch.nn.Parameter],
        micro_step: int,
        *,
        norm: bool = False,
        names: Names | None = None,
    ) -> GradNorm | None:
        """:meth:`step`, returning the gradient norm as a :class:`GradNorm` handle.

        Nothing waits for the GPU here (bf16/fp32), and nothing measures the norm unless
        clipping needs it, ``norm=True`` asks for it, or the handle is read: read it every N
        steps, not every step, and the host stays ahead of the device and the step makes no
        pass over the gradients that is not used. In fp16 the overflow check still syncs.

        Args:
            params: The parameters whose gradients are clipped and measured.
            micro_step: 0-based micro-batch index (see :func:`should_step`).
            norm: Measure the norm at the step even without clipping.
            names: ``model.named_parameters`` (called only when a step is skipped for a
                NaN/Inf, to name the first non-finite gradient).

        Returns:
            The norm before clipping (``inf`` when an fp16 step was skipped for overflow), or
            None off a boundary.
        """
        if not should_step(micro_step, self.grad_accum_steps):
            return None
        if self._scaling:  # unscale before clip: clipping scaled grads would not clip at all
            self._scaler.unscale_(self.optimizer)
        value: torch.Tensor | None = None
        owners: list[torch.nn.Parameter] = []
        grads: list[torch.Tensor] = []
        if self.max_grad_norm is not None:
            params = [p for p in params if p.grad is not None]
            value = clip_grad_norm(params, self.max_grad_norm)
        else:
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        owners.append(p)
                        grads.append(p.grad)
            if norm or (grads and hasattr(grads[0], "full_tensor")):  # FSDP2: a collective
                value = total_norm([p.grad for p in params if p.grad is not None])
        guard, self._names = self._guard, names
        self.last_nonfinite = None
        if guard is not None and guard.pending is not None:
            self._settle(steps_ago=1)  # the last step's flags, left on the device
        nonfinite, found_inf = False, None
        if guard is not None:  # the flag every rank agrees on (see nonfinite_guard)
            if self.max_grad_norm is not None:
                owners = list(params)  # those with a gradient (clipping filtered them)
                grads = [p.grad for p in owners if p.grad is not None]
            if not self._scaling and defers_on_device(
                self.optimizer, grads, on_cpu=self._defer_on_cpu
            ):
                found_inf = guard.defer(value, grads, owners)
            else:
                nonfinite = guard.nonfinite_now(value, grads, owners)
                if nonfinite:  # every rank is here: the flag is the same everywhere
                    index = first_nonfinite(names()) if names is not None else -1
                    self.last_nonfinite = self._diagnose(guard.take_losses_bad(), index, names)
                else:
                    guard.forget_losses()
        pending = None if value is not None else GradNorm._unmeasured(params, owners, grads, False)
        scale_before = self._scaler.get_scale() if self._scaling else None
        if found_inf is not None:  # the fused kernel skips the update on the device
            self.optimizer.found_inf = found_inf  # type: ignore[attr-defined]
            self.optimizer.grad_scale = None  # type: ignore[attr-defined]
            try:
                self.optimizer.step()
            finally:
                self.optimizer.found_inf = None  # type: ignore[attr-defined]
            skipped = False  # known at the next step (settle)
        elif nonfinite and not self._scaling:
            skipped = True  # bf16/fp32: nothing else would have stopped this step
        elif not self._scaling:
            self.optimizer.step()  # what the disabled scaler's step() calls; update() is a no-op
            skipped = False
        else:
            self._scaler.step(self.optimizer)  # skips the step when a gradient is inf/NaN
            self._scaler.update()
            # The scaler halves its scale exactly when it skipped the step for an overflow.
            skipped = scale_before is not None and self._scaler.get_scale() < scale_before
        self.last_step_skipped = skipped
        if self.last_step_skipped:
            self.skipped_steps += 1
        if guard is not None and self.last_nonfinite is None and found_inf is None:
            self.nonfinite_in_a_row = 0
        self.optimizer.zero_grad(set_to_none=True)
        if pending is None:
            assert value is not None
            return GradNorm(_finish_norm(value, self.last_step_skipped))
        pending._skipped = self.last_step_skipped
        if self._unread is not None:
            self._unread._release()
        self._unread = pending
        return pending

    def settle(self) -> None:
        """Read the step's NaN/Inf flags now if they were left on the device (a fused CUDA
        optimizer skips on them by itself: :mod:`~gpu_training.nonfinite_guard`); the next
        step would read them. Every rank calls it at the same step: a skipped step's
        diagnosis is an all-gather. :attr:`last_nonfinite` keeps the previous step's
        diagnosis unless this step was skipped too.
        """
        self._settle(steps_ago=0)

    def _settle(self, steps_ago: int) -> None:
        guard = self._guard
        if guard is None or guard.pending is None:
            return
        pending, guard.pending = guard.pending, None
        nonfinite, loss_bad, bad = pending.read()
        if not nonfinite:
            self.nonfinite_in_a_row = 0
            return
        self.skipped_steps += 1
        self.last_step_skipped = self.last_step_skipped or steps_ago == 0
        index = -1
        if self._names is not None and bad:
            where = {id(p): i for i, (_, p) in enumerate(self._names())}
            index = min(where.get(id(p), -1) for p in bad)
        found = self._diagnose(loss_bad, index, self._names)
        if found is not None:
            self.last_nonfinite = replace(found, steps_ago=steps_ago)

    def _diagnose(self, loss_bad: bool, index: int, names: Names | None) -> NonFiniteStep | None:
        """Which ranks' losses were non-finite, and the first non-finite gradient (``index``
        in ``names``' order, this rank's; -1: none): one small all-gather, on every rank
        (each reaches it on the same step). Updates the count in a row; None for an fp16
        overflow with finite losses (the scaler's calibration)."""
        flags = gather_flags(loss_bad, index)
        ranks = tuple(r for r, (bad, _) in enumerate(flags) if bad)
        if self._scaler.is_enabled() and not ranks:
            return None  # an fp16 overflow: the scaler skips it and lowers its scale
        self.nonfinite_in_a_row += 1
        name = parameter_name(flags, names)
        return NonFiniteStep(loss_ranks=ranks, parameter=name, in_a_row=self.nonfinite_in_a_row)

    def _drop_unread(self) -> None:
        assert self._unread is not None
        self._unread._release()
        self._unread = None

    def state_dict(self) -> dict[str, Any]:
        """Precision, scaler state (scale, growth tracker) and the skipped-step count."""
        return {
            "precision": self.precision,
            "grad_accum_steps": self.grad_accum_steps,
            "scaler": self._scaler.state_dict(),
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, so a resumed fp16 run keeps its scale factor.

        Raises:
            ValueError: If the state was saved with another precision.
        """
        if state.get("precision") != self.precision:
            raise ValueError(
                f"checkpoint was saved with precision {state.get('precision')!r}, "
                f"this run uses {self.precision!r}"
            )
        scaler_state = state.get("scaler") or {}
        if scaler_state:
            self._scaler.load_state_dict(scaler_state)
        self.skipped_steps = int(state.get("skipped_steps", 0))


MixedPrecisionTrainer = MixedPrecisionStepper
"""The name the guides use for :class:`MixedPrecisionStepper` (the same class)."""
