"""``gpu-training lint`` ``GT006``: a model saved before it is wrapped is the plain model.

Issue 33, the fifth random sample of findings (``benchmarks/lint_ddpsample5_triage.csv``): a
DDP script saves rank 0's initial weights (``torch.save(model.state_dict(), path)``) so the
other ranks load them, and only then wraps ``model = DDP(model)``. The save ran before any
wrapping, in straight-line code, yet ``GT006`` said "model is the DDP wrapper": every binding
of the function counted, wherever it was. A binding after the read reaches it only through a
loop around both; a save inside the epoch loop of a model wrapped later in that loop, or one
after the wrapping, is still reported. Minimal reproductions written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main(path):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = nn.Linear(4, 2).cuda()
BODY
    dist.destroy_process_group()


if __name__ == "__main__":
    main("init.pt")
"""

_SAVE_THEN_WRAP = """\
    if rank == 0:
        torch.save(model.state_dict(), path)
    dist.barrier()
    model.load_state_dict(torch.load(path, weights_only=True))
    model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])])
    model(torch.ones(1, 4)).sum().backward()
"""


def test_a_model_saved_before_it_is_wrapped_is_not_the_wrapper(tmp_path: Path) -> None:
    files = {"train.py": _SCRIPT.replace("BODY", _SAVE_THEN_WRAP.rstrip("\n"))}
    assert repo_findings(tmp_path, files, "GT006") == []


@pytest.mark.parametrize(
    "body",
    [
        # saved after the wrapping
        "    model = DDP(model)\n    if rank == 0:\n        torch.save(model.state_dict(), path)",
        # saved in a loop whose later line wraps it: the second pass saves the wrapper
        "    for epoch in range(3):\n"
        "        if rank == 0:\n"
        "            torch.save(model.state_dict(), path)\n"
        "        model = DDP(model)",
    ],
    ids=["after", "loop"],
)
def test_a_save_the_wrapping_reaches_stays_reported(tmp_path: Path, body: str) -> None:
    files = {"train.py": _SCRIPT.replace("BODY", body)}
    assert len(repo_findings(tmp_path, files, "GT006")) == 1
