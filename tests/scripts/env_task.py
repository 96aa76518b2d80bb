"""fault_task's model and data (no fault planned), and a record of how each rank was started.

A job file names it with import strings (``tests/scripts`` on ``PYTHONPATH``)::

    task: {model: "env_task:build_model", data: "env_task:build_data"}

On a rank that torchrun started (``LOCAL_RANK`` set), :func:`build_model` writes the launcher's
variables it found to ``$ENV_RECORD/rank{RANK}.json`` (tests/test_launcher.py reads them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fault_task import build_data
from fault_task import build_model as _build_model
from torch import nn

__all__ = ["RECORDED", "build_data", "build_model"]

RECORDED = (
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "TORCHELASTIC_MAX_RESTARTS",
)


def build_model() -> nn.Module:
    """fault_task's model, after writing this rank's record."""
    if "LOCAL_RANK" in os.environ and os.environ.get("ENV_RECORD"):
        record = {key: os.environ.get(key) for key in RECORDED}
        path = Path(os.environ["ENV_RECORD"]) / f"rank{os.environ['RANK']}.json"
        path.write_text(json.dumps(record))
    return _build_model()
