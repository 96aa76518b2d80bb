"""``gpu-training lint`` ``GT001``: a DataParallel wrapper nothing runs (round 27).

Issue 33, the third random sample of findings (``benchmarks/lint_ddpsample3_triage.csv``): a
debugging script wraps a distillation model in ``nn.DataParallel`` only so that a checkpoint
saved with ``module.`` keys loads (``net.load_state_dict(state)``), then calls
``net.module.record_grad(x)``: every call goes round the wrapper, nothing is scattered to a
GPU, and ``GT001`` ("one process, one thread per GPU") was reported. A wrapper whose every use
is a harmless method, ``.module`` or ``.state_dict()`` is not reported now; one that is run
(outside ``no_grad``), handed on or trained still is. Minimal reproductions written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import torch.nn as nn


def record(model, loader, path):
    net = model.cuda()
    net = nn.DataParallel(net)
    net.load_state_dict(torch.load(path, weights_only=True))
    net.eval()
    for x, y in loader:
        USE


if __name__ == "__main__":
    record(nn.Linear(2, 2), [], "ckpt.pth")
"""


@pytest.mark.parametrize(
    "use",
    ["net.module.record_grad(x.cuda())", "print(sorted(net.state_dict()))"],
    ids=["module", "state-dict"],
)
def test_a_wrapper_every_use_of_which_goes_round_it_is_not_reported(
    tmp_path: Path, use: str
) -> None:
    files = {"debug_grads.py": _SCRIPT.replace("USE", use)}
    assert repo_findings(tmp_path, files, "GT001") == []


@pytest.mark.parametrize(
    "use",
    [
        "net(x).sum().backward()",  # run outside no_grad: it may train
        "net.module.record_grad(x)\n        net(x)",  # also run
        "torch.optim.SGD(net.parameters(), lr=0.1)",  # its parameters to an optimizer
    ],
    ids=["trained", "also-run", "optimized"],
)
def test_a_wrapper_that_runs_stays_reported(tmp_path: Path, use: str) -> None:
    files = {"debug_grads.py": _SCRIPT.replace("USE", use)}
    assert repo_findings(tmp_path, files, "GT001") == [("debug_grads.py", 7)]
