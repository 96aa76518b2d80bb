"""The built-in ``charlm`` task with a brake, for tests that signal a job mid-run.

A job file names it as a task factory (``tests/scripts`` on ``PYTHONPATH``), with charlm's
own options::

    task: "held_charlm:task"
    task_options: {block_size: 16, n_layer: 1, n_head: 2, n_embd: 16}

The model, data, loss and so the weights are charlm's. Only this differs: with
``HOLD_FILE`` set, every training forward after the first ``HOLD_AFTER`` (default 3) of the
process waits while that file exists. A test creates the file before the job starts, sees the
job held at step ``HOLD_AFTER + 1``, sends its signal, and removes the file: the signal lands
mid-run whatever the scheduler's timing, and the resumed run (file gone) does not wait.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from torch import nn

from gpu_training.tasks import Task, resolve_task


def _hold(module: nn.Module, _inputs: Any) -> None:
    if not module.training:
        return
    calls = getattr(module, "_held_calls", 0) + 1
    module._held_calls = calls  # type: ignore[assignment]
    path = os.environ.get("HOLD_FILE")
    if path and calls > int(os.environ.get("HOLD_AFTER", "3")):
        while os.path.exists(path):
            time.sleep(0.05)


def task(**options: Any) -> Task:
    """charlm with ``options``; its models wait in training forwards while ``HOLD_FILE`` exists."""
    base = resolve_task("charlm", options)

    def build_model() -> nn.Module:
        model = base.build_model()
        model.register_forward_pre_hook(_hold)
        return model

    return dataclasses.replace(base, build_model=build_model)
