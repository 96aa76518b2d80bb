"""The built-in ``charlm`` task with a planted NaN, for the non-finite guard's tests.

A job file names it as a task factory (``tests/scripts`` on ``PYTHONPATH``)::

    task: "nan_charlm:task"

With ``NAN_RANK`` (default 1) and ``NAN_STEPS`` (``7``: the 7th training forward only;
``3-``: the 3rd and every later one), that rank's model output is multiplied by NaN in those
training forwards, so its loss and then its gradients are NaN. One micro-batch per step
(no accumulation) makes the forward's count the step's number. ``NAN_FUSED=1`` builds
AdamW fused (the GPU's optimizer; its NaN skip happens on the device). In its first evaluation
forward each rank of a replicated model prints ``WEIGHTS rank=R sum=<hex>``, the exact sum
of its weights. Everything else is charlm's.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from torch import nn

from gpu_training.tasks import Task, resolve_task


def _planted(count: int) -> bool:
    spec = os.environ.get("NAN_STEPS", "")
    if spec.endswith("-"):
        return count >= int(spec[:-1])
    return bool(spec) and count == int(spec)


def _poison(module: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor | None:
    if not module.training:  # evaluation: say what this rank's weights are, once
        if not getattr(module, "_nan_told", False) and not _sharded(module):
            module._nan_told = True  # type: ignore[assignment]
            total = sum(p.detach().double().sum() for p in module.parameters())
            print(
                f"WEIGHTS rank={os.environ.get('RANK', '0')} sum={float(total).hex()}", flush=True
            )
        return None
    count = getattr(module, "_nan_calls", 0) + 1
    module._nan_calls = count  # type: ignore[assignment]
    if os.environ.get("RANK", "0") == os.environ.get("NAN_RANK", "1") and _planted(count):
        return output * float("nan")
    return None


def _sharded(module: nn.Module) -> bool:
    return any(hasattr(p, "full_tensor") for p in module.parameters())


def _fused_adamw() -> None:
    """``NAN_FUSED=1``: every AdamW is built fused, as the Trainer builds it on a GPU (its
    guard then skips on the device and reads the flag a step later), here on the CPU."""
    init = torch.optim.AdamW.__init__

    def fused_init(self: torch.optim.AdamW, *args: Any, **kwargs: Any) -> None:
        kwargs["fused"] = True
        init(self, *args, **kwargs)

    torch.optim.AdamW.__init__ = fused_init  # type: ignore[method-assign]


def task(**options: Any) -> Task:
    """charlm with ``options``; rank ``NAN_RANK``'s outputs are NaN in the ``NAN_STEPS``."""
    base = resolve_task("charlm", options)
    if os.environ.get("NAN_FUSED") == "1":
        _fused_adamw()

    def build_model() -> nn.Module:
        model = base.build_model()
        model.register_forward_hook(_poison)
        return model

    return dataclasses.replace(base, build_model=build_model)
