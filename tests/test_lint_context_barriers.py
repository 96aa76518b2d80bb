"""``gpu-training lint`` ``GT009``: "rank 0 goes first" written as a context manager class.

Issue 33, a whole-repository run of NVIDIA/NeMo (benchmarks/README.md, "A whole-repository run
of a large tree"): a class whose ``__enter__`` makes every rank but the node's first wait
(``if not self._first: dist.barrier()``) and whose ``__exit__`` releases them
(``if self._first: dist.barrier()``) was two ``GT009`` findings, because the two barriers were
paired only within one function. A ``with`` runs both halves, so every rank reaches one
barrier: they pair as one function. A barrier on one side only, or halves of two different
classes, stay reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import os

import torch.distributed as dist


class FirstOnNode:
    def __enter__(self):
        if not dist.is_initialized():
            return True
        self._first = int(os.environ.get("LOCAL_RANK", "0")) == 0
ENTER
        return self._first

    def __exit__(self, exc_type, exc, tb):
EXIT
        return False


class Other:
    def __enter__(self):
        self._first = int(os.environ.get("LOCAL_RANK", "0")) == 0
        return self

    def __exit__(self, exc_type, exc, tb):
OTHER_EXIT
        return False


def main():
    dist.init_process_group("nccl")
    with FirstOnNode() as first:
        if first:
            print("preparing the data once per node")
    with Other():
        print("evaluating")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

_WAIT = "        if not self._first:\n            dist.barrier()"
_RELEASE = "        if self._first and dist.is_initialized():\n            dist.barrier()"
_NOTHING = "        pass"


@pytest.mark.parametrize(
    ("enter", "exit_", "other_exit", "reported"),
    [
        (_WAIT, _RELEASE, _NOTHING, []),  # the two halves meet
        (_WAIT, _NOTHING, _NOTHING, ["wait"]),  # the others wait for nobody: a hang
        (_NOTHING, _RELEASE, _NOTHING, ["release"]),
        (_WAIT, _NOTHING, _RELEASE, ["wait", "release"]),  # another class's exit
    ],
)
def test_a_context_managers_two_halves_pair(
    tmp_path: Path, enter: str, exit_: str, other_exit: str, reported: list[str]
) -> None:
    script = _SCRIPT.replace("OTHER_EXIT", other_exit).replace("ENTER", enter)
    script = script.replace("EXIT", exit_)
    lines = script.splitlines()
    barriers = [i + 1 for i, text in enumerate(lines) if "dist.barrier()" in text]
    at = {"wait": barriers[0], "release": barriers[-1]}
    expected = sorted(("train.py", at[name]) for name in reported)
    assert repo_findings(tmp_path, {"train.py": script}, "GT009") == expected
