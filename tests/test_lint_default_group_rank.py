"""``gpu-training lint``: ``get_rank(group)`` on the default group is the global rank.

A project's ``get_rank(group=None)`` wrapper fills in ``get_default_group()`` and returns
``torch.distributed.get_rank(group)``: the rank in the world group, global, so
``is_main_process()`` (``get_rank() == 0``) writes once per job, not once per node (no
``GT017``). A rank in a group of its own (``dist.get_rank(group=_LOCAL_PROCESS_GROUP)``,
detectron2's per-machine group) stays node-local. Minimal reproductions written here (issue 33,
set 26: a remote-sensing VLM's trainer utilities).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_SCRIPT = """\
import torch.distributed as torch_dist
from torch.distributed.distributed_c10d import _get_default_group as get_default_group

_LOCAL_PROCESS_GROUP = None


def get_rank(group=None):
    if torch_dist.is_available() and torch_dist.is_initialized():
        if group is None:
            group = {group}
        return torch_dist.get_rank(group)
    return 0


def is_main_process():
    return get_rank() == 0


def main():
    torch_dist.init_process_group("nccl")
    global _LOCAL_PROCESS_GROUP
    _LOCAL_PROCESS_GROUP = torch_dist.new_group([0, 1])
    if is_main_process():
        with open("results.json", "w") as f:
            f.write("{}")
    torch_dist.destroy_process_group()


main()
"""


@pytest.mark.parametrize(
    ("group", "codes"),
    [
        ("get_default_group()", []),
        ("torch_dist.group.WORLD", []),
        ("_LOCAL_PROCESS_GROUP", ["GT017"]),
    ],
    ids=["default_group", "world", "local_group"],
)
def test_the_rank_in_the_default_group_is_global(
    tmp_path: Path, group: str, codes: list[str]
) -> None:
    (tmp_path / "train.py").write_text(_SCRIPT.replace("{group}", group))
    report = lint_paths([tmp_path / "train.py"])
    assert not report.errors, report.errors
    assert [f.code for f in report.findings] == codes
