"""``gpu-training lint`` ``GT014``: a learning-rate getter whose value is only shown.

Issue 33, the third random sample of findings over 111 DDP repositories
(``benchmarks/lint_ddpsample3_triage.csv``): an image-restoration toolbox logs, on rank 0
only, ``"<epoch:{:3d}, iter:{:8,d}, lr:{:.3e}> ".format(epoch, step,
model.current_learning_rate())``; the method returns ``self.schedulers[0].get_lr()[0]`` and
changes nothing (the reader: false). A call named for the learning rate whose value only goes
into a message (``str.format``, an f-string, ``%``, ``print``, a logger) is a read; the same
name called for its effect, or its value kept, under a rank guard stays a ``GT014``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import logging

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def main(model, steps):
    dist.init_process_group("gloo")
    for step in range(steps):
        model.optimize_parameters(step)
        if dist.get_rank() == 0:
            LINE
    dist.destroy_process_group()
"""


@pytest.mark.parametrize(
    ("line", "reported"),
    [
        ("logger.info('lr:{:.3e}'.format(model.current_learning_rate()))", False),
        ("print(f'lr {model.current_learning_rate():.3e}')", False),
        ("logger.info('lr %.3e' % model.current_learning_rate())", False),
        ("logger.info('lr %s', model.current_learning_rate())", False),
        ("model.update_learning_rate(step)", True),
        ("lr = model.current_learning_rate()", True),
    ],
)
def test_a_value_only_shown_changes_nothing(tmp_path: Path, line: str, reported: bool) -> None:
    found = repo_findings(tmp_path, {"train.py": _SCRIPT.replace("LINE", line)}, "GT014")
    assert found == ([("train.py", 14)] if reported else [])
