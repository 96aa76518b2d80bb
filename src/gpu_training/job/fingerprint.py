"""Which job settings are the run's math, their hash, and how two jobs differ.

A checkpoint's manifest records the job (``to_dict()``) and the hash of its math settings;
a resume compares them with the job it runs (:mod:`gpu_training.resume`). Left out of the
math: how many ranks run it and how a global batch is split over them, how the strategy
lays the model out, how many DataLoader workers read a stream, and the non-finite step
budget — none changes which samples a step sees or what it computes.

Example:
    >>> job = {"task": {"name": "charlm"}, "task_options": {"stream_workers": 2},
    ...        "training": {"world_size": 2, "learning_rate": 1e-3}, "strategy": {}}
    >>> math_settings(job)["task_options"], math_settings(job)["training"]
    ({}, {'learning_rate': 0.001})
    >>> settings_hash(math_settings(job)) == settings_hash(math_settings(
    ...     {**job, "task_options": {"stream_workers": 0}}))
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from gpu_training.strategy.spec import StrategyConfig, deepspeed_math

__all__ = [
    "NOT_MATH_TASK_OPTIONS",
    "math_changes",
    "math_settings",
    "older_hashes",
    "settings_hash",
]

NOT_MATH_TASK_OPTIONS = ("stream_workers",)
"""Task options that only say how data is read: DataLoader workers of a stream take this
rank's micro-batches round-robin, so any count feeds a step the same samples in order."""

_LAYOUT_FIELDS = {f.name for f in dataclasses.fields(StrategyConfig)}
"""Every strategy field lays the run out: only what a DeepSpeed file says is math."""
_OLDER: dict[str, set[str] | None] = {
    "layout": _LAYOUT_FIELDS - {"tensor_parallel", "tp_plan"},  # every field then, but TP's
    "deepspeed": {"deepspeed_config", "zero_stage", "offload", "cpu_offload"},
    "workers": None,  # today's strategy math, but stream_workers still counted
}
"""The definitions older manifests hashed with, oldest first (:func:`older_hashes`)."""


def settings_hash(settings: Mapping[str, Any]) -> str:
    """A short, stable hash of plain settings (sorted JSON, sha256, 16 hex digits)."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def math_settings(job: Mapping[str, Any], *, then: str | None = None) -> dict[str, Any]:
    """The settings of a job's ``to_dict()`` that define its math.

    Args:
        job: A job as plain data (``JobConfig.to_dict()`` or a manifest's copy).
        then: An older definition's name (``layout``, ``deepspeed``, ``workers``), to hash
            as manifests written under it did; None: today's.

    Returns:
        ``task``, ``task_options``, ``strategy`` (what a DeepSpeed file says) and
        ``training``, less the fields that do not change the math.
    """
    training = dict(job.get("training") or {})
    training.pop("world_size", None), training.pop("max_nonfinite_steps", None)  # not math
    if training.get("global_batch_size") is not None:  # any split of it: the same math
        training.pop("gradient_accumulation_steps", None)
        training.pop("per_device_batch_size", None)
    payload = {k: job.get(k) for k in ("task", "task_options", "strategy")}
    options = payload["task_options"]
    if then is None and isinstance(options, Mapping):
        payload["task_options"] = {
            k: v for k, v in options.items() if k not in NOT_MATH_TASK_OPTIONS
        }
    strategy = payload["strategy"]
    keep = _OLDER[then] if then is not None else None
    if isinstance(strategy, Mapping) and keep is None:
        payload["strategy"] = {"deepspeed": deepspeed_math(strategy)}
    elif isinstance(strategy, Mapping) and keep is not None:  # as manifests hashed it then
        payload["strategy"] = {k: v for k, v in strategy.items() if k in keep}
    payload["training"] = training
    return payload


def older_hashes(job: Mapping[str, Any]) -> tuple[str, ...]:
    """The hashes older definitions of the math gave ``job``, oldest first."""
    return tuple(settings_hash(math_settings(job, then=t)) for t in _OLDER)


def math_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """How job ``now`` differs from ``saved`` (both plain data), math first.

    Returns:
        ``(math, other)``: lines ``"section.field: old -> new"``.
    """
    now = json.loads(json.dumps(now, default=str))  # tuples as lists, as saved
    math_now, math_then = _flat(math_settings(now)), _flat(math_settings(saved))
    rest_now = {k: v for k, v in _flat(now).items() if k not in _flat_keys_of_math(now)}
    rest_then = {k: v for k, v in _flat(saved).items() if k not in _flat_keys_of_math(saved)}
    return _diff(math_then, math_now), _diff(rest_then, rest_now)


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{name}."))  # an empty section adds no keys
        else:
            out[name] = value
    return out


def _flat_keys_of_math(job: Mapping[str, Any]) -> set[str]:
    keys = set(_flat(math_settings(job)))
    training = job.get("training") or {}
    # the rank count is not the math; neither is the accumulation it implies, nor the layout
    keys |= {"training.world_size", *(f"strategy.{name}" for name in _LAYOUT_FIELDS)}
    if training.get("global_batch_size") is not None:
        keys |= {"training.gradient_accumulation_steps", "training.per_device_batch_size"}
    return keys


def _diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    missing = object()
    lines = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, missing), new.get(key, missing)
        if before != after:
            show = [
                ("(unset)" if v is missing else json.dumps(v, default=str)) for v in (before, after)
            ]
            lines.append(f"{key}: {show[0]} -> {show[1]}")
    return lines
