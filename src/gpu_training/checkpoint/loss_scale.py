"""The fp16 dynamic loss scale carried between DeepSpeed and torch's GradScaler.

The two scalers keep different state. torch's ``GradScaler`` (none, DDP) has a ``scale``, a
``_growth_tracker`` (clean steps since the scale last changed) and its settings
(``growth_interval``, ``growth_factor``, ``backoff_factor``). DeepSpeed's
``DynamicLossScaler`` (ZeRO-1/2/3) has ``cur_scale``, ``cur_iter`` and ``last_overflow_iter``
(clean steps are counted from the last overflow), ``cur_hysteresis`` (overflows it may still
absorb before it lowers the scale) and its settings (``scale_window``, ``delayed_shift``,
``min_scale``). :class:`LossScale` is what both have in common, and what the run state
carries across:

- ``scale``: exactly;
- ``clean_steps``: the clean steps since the scale last changed or overflowed, so each scaler
  keeps counting toward its own next growth; each grows by its own window (the target job's
  settings, never the written run's);
- ``skipped_steps``: the overflow skips so far (the metrics' ``skipped_steps``; DeepSpeed's
  ``engine.skipped_steps``);
- DeepSpeed's own counters (``cur_iter``, ``last_overflow_iter``, ``cur_hysteresis``) where
  DeepSpeed wrote it and DeepSpeed resumes it: verbatim.

What cannot map: hysteresis has no counterpart in GradScaler (it backs off at every
overflow), so DeepSpeed resuming a GradScaler's run starts with its full hysteresis, and a
GradScaler resuming DeepSpeed's forgets the overflows DeepSpeed absorbed. A static DeepSpeed
scale (``fp16.loss_scale`` > 0) is configuration, not state: nothing is carried from it or
into it.

Example:
    >>> record = loss_scale_of({"amp_state": {"scaler": {"scale": 1024.0,
    ...                                                    "_growth_tracker": 7}}})
    >>> record.scale, record.clean_steps
    (1024.0, 7)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpu_training.amp import MixedPrecisionStepper
from gpu_training.checkpoint.files import CheckpointError

__all__ = [
    "RUN_STATE_KEY",
    "LossScale",
    "carry_into_engine",
    "carry_into_stepper",
    "deepspeed_loss_scale",
    "loss_scale_of",
]

RUN_STATE_KEY = "loss_scale"
"""Where a run state read from DeepSpeed's files holds its :class:`LossScale` (a plain dict)."""

_NATIVE = ("cur_iter", "last_overflow_iter", "cur_hysteresis")


@dataclass(frozen=True)
class LossScale:
    """An fp16 dynamic loss scale, as every scaler here can resume it (module docstring)."""

    scale: float
    """The loss-scale factor."""
    clean_steps: int
    """Steps without an overflow since the scale last changed or overflowed."""
    skipped_steps: int = 0
    """Steps skipped for an overflow so far."""
    deepspeed: Mapping[str, int] | None = None
    """DeepSpeed's ``cur_iter``, ``last_overflow_iter``, ``cur_hysteresis``; None from GradScaler."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for a run state (``weights_only`` loads it)."""
        out = asdict(self)
        out["deepspeed"] = dict(self.deepspeed) if self.deepspeed is not None else None
        return out


def deepspeed_loss_scale(scaler: Any, skipped_steps: int = 0) -> LossScale | None:
    """A DeepSpeed loss scaler's state (a live engine's or one read from its files).

    Args:
        scaler: ``engine.optimizer.loss_scaler`` or an optimizer file's ``loss_scaler``.
        skipped_steps: ``engine.skipped_steps`` (the model-states file's).

    Returns:
        The state, or None for a static scaler (bf16, fp32 or a fixed fp16 scale).
    """
    if not getattr(scaler, "dynamic", False):
        return None
    if not all(hasattr(scaler, key) for key in (*_NATIVE, "cur_scale")):
        return None  # a DeepSpeed older than its hysteresis counters: nothing safe to map
    native = {key: int(getattr(scaler, key)) for key in _NATIVE}
    window = max(int(getattr(scaler, "scale_window", 1)), 1)
    # DeepSpeed counts from the last overflow and grows at every window-th clean step after
    # the first window + 1: past that, the count since the last growth is what carries
    since_overflow = native["cur_iter"] - native["last_overflow_iter"] - 1
    clean = since_overflow if since_overflow <= window else (since_overflow - 1) % window
    return LossScale(float(scaler.cur_scale), max(clean, 0), int(skipped_steps), native)


def loss_scale_of(run_state: Mapping[str, Any]) -> LossScale | None:
    """The loss scale a run state carries: DeepSpeed's (read from its files) or a GradScaler's.

    Returns:
        None when the run did not use a dynamic fp16 scale (or the state predates it).

    Raises:
        CheckpointError: If the state's ``loss_scale`` is not one.
    """
    saved = run_state.get(RUN_STATE_KEY)
    if saved is not None:
        try:
            native = saved.get("deepspeed")
            return LossScale(
                float(saved["scale"]),
                int(saved["clean_steps"]),
                int(saved.get("skipped_steps") or 0),
                {k: int(native[k]) for k in _NATIVE} if native is not None else None,
            )
        except (AttributeError, KeyError, TypeError, ValueError) as err:  # data, maybe hostile
            raise CheckpointError(f"its {RUN_STATE_KEY!r} is not a loss scale ({err!r})") from None
    amp = run_state.get("amp_state")
    scaler = amp.get("scaler") if isinstance(amp, Mapping) else None
    if not isinstance(scaler, Mapping) or "scale" not in scaler:  # bf16/fp32: disabled, {}
        return None
    assert isinstance(amp, Mapping)
    skipped = int(amp.get("skipped_steps") or 0)
    return LossScale(float(scaler["scale"]), int(scaler.get("_growth_tracker", 0)), skipped)


def carry_into_stepper(stepper: MixedPrecisionStepper, record: LossScale | None) -> bool:
    """Puts a loss scale into a stepper's GradScaler, with the stepper's own settings.

    Returns:
        Whether anything was carried (not when ``record`` is None or the stepper is not fp16).
    """
    if record is None or not stepper.scaler.is_enabled():
        return False
    state = stepper.scaler.state_dict()  # this job's growth interval and factors stay
    tracker = min(record.clean_steps, int(state["growth_interval"]) - 1)
    state.update(scale=record.scale, _growth_tracker=tracker)
    stepper.load_state_dict(
        {"precision": stepper.precision, "scaler": state, "skipped_steps": record.skipped_steps}
    )
    return True


def carry_into_engine(engine: Any, record: LossScale | None) -> bool:
    """Puts a loss scale into a DeepSpeed engine's dynamic loss scaler (its settings stay).

    Args:
        engine: A ``DeepSpeedEngine``, before its first step.
        record: What to carry (None: nothing).

    Returns:
        Whether anything was carried (not when ``record`` is None or the scaler is static).
    """
    scaler = getattr(getattr(engine, "optimizer", None), "loss_scaler", None)
    if record is None or not getattr(scaler, "dynamic", False):
        return False
    assert scaler is not None
    scaler.cur_scale = max(record.scale, float(scaler.min_scale))
    if record.deepspeed is not None:  # DeepSpeed wrote it: its counters as they were
        scaler.cur_iter = record.deepspeed["cur_iter"]
        scaler.last_overflow_iter = record.deepspeed["last_overflow_iter"]
        scaler.cur_hysteresis = min(record.deepspeed["cur_hysteresis"], scaler.delayed_shift)
    else:  # GradScaler's: the clean steps so far, and no overflow absorbed (full hysteresis)
        scaler.last_overflow_iter = scaler.cur_iter - record.clean_steps - 1
        scaler.cur_hysteresis = scaler.delayed_shift
    engine.skipped_steps = record.skipped_steps
    return True
