"""``gpu-training lint`` ``GT007``: a download between the barriers of "rank 0 goes first".

Issue 33, the third random sample of findings over 111 DDP repositories
(``benchmarks/lint_ddpsample3_triage.csv``): a cluster tutorial's DeepSpeed MNIST script has
``if dist.get_rank() != 0: dist.barrier()``, then ``MNIST("./data", download=True)``, then
``if dist.get_rank() == 0: dist.barrier()``: rank 0 downloads while the others wait, and they
find the files when they run the line (the reader: false, ``guarded``). The same pair inside
``if args.distributed:`` counts too. A ``torch.save`` there is still every rank's write (each
rank writes after the barrier, only later), and a download with one barrier only is
reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import torch.distributed as dist
from torchvision import datasets


def main():
    dist.init_process_group("gloo")
BEFORE
    data = WRITE
AFTER
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

_OTHERS_WAIT = "    if dist.get_rank() != 0:\n        dist.barrier()"
_RANK0_RELEASES = "    if dist.get_rank() == 0:\n        dist.barrier()"
_NESTED_WAIT = "    if USE_DDP:\n        if dist.get_rank() != 0:\n            dist.barrier()"
_NESTED_RELEASE = "    if USE_DDP:\n        if dist.get_rank() == 0:\n            dist.barrier()"
_DOWNLOAD = 'datasets.MNIST("./data", download=True)'
_SAVE = 'torch.save({}, "state.pt")'


@pytest.mark.parametrize(
    ("before", "write", "after", "reported"),
    [
        (_OTHERS_WAIT, _DOWNLOAD, _RANK0_RELEASES, False),
        (_NESTED_WAIT, _DOWNLOAD, _NESTED_RELEASE, False),
        (_OTHERS_WAIT, _SAVE, _RANK0_RELEASES, True),
        (_OTHERS_WAIT, _DOWNLOAD, "    dist.barrier()", True),
        ("    pass", _DOWNLOAD, _RANK0_RELEASES, True),
        (_RANK0_RELEASES, _DOWNLOAD, _OTHERS_WAIT, True),
    ],
)
def test_rank0_goes_first(
    tmp_path: Path, before: str, write: str, after: str, reported: bool
) -> None:
    script = _SCRIPT.replace("BEFORE", before).replace("WRITE", write).replace("AFTER", after)
    script = script.replace("USE_DDP", "dist.is_initialized()")
    line = 1 + next(i for i, s in enumerate(script.splitlines()) if "data = " in s)
    expected = [("train.py", line)] if reported else []
    assert repo_findings(tmp_path, {"train.py": script}, "GT007") == expected
