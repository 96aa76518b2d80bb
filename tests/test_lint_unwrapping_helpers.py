"""``gpu-training lint`` ``GT006``: a save helper that unwraps the model with an ``if`` statement.

Issue 33, the second random sample of findings over 111 DDP repositories
(``benchmarks/lint_ddpsample2_triage.csv``): a cardiac-imaging repository's
``save_checkpoint(path, model, optimizer)`` tests ``if hasattr(model, 'module'):`` and saves
``model.module.state_dict()``, else ``model.state_dict()``; the training loop hands it the DDP
model. The keys carry no ``module.`` prefix (the reader: false, ``unwrapped``). The
expression form (``m.module.state_dict() if hasattr(m, "module") else m.state_dict()``) was
understood; the statement form was not. Under a test that says nothing of the model the plain
branch may be the wrapper's (held-back set 10 has the DDP branch saving ``model.state_dict()``
and the other unwrapping), and a helper that never unwraps stays reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_TRAIN = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from utils import save_checkpoint


def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if dist.get_rank() == 0:
        save_checkpoint("model.pt", model, optimizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

_UTILS = """\
import torch


def save_checkpoint(path, model, optimizer):
    if TEST:
        state = model.module.state_dict()
    else:
        state = model.state_dict()
    torch.save({"model": state, "optimizer": optimizer.state_dict()}, path)
"""


@pytest.mark.parametrize(
    ("test", "found"),
    [
        ("hasattr(model, 'module')", []),
        ('hasattr(model, "module")', []),
        ("path.endswith('.pt')", [("train.py", 13)]),  # a test that says nothing of the model
    ],
)
def test_a_helper_that_unwraps_in_an_if(tmp_path: Path, test: str, found: list) -> None:
    files = {"train.py": _TRAIN, "utils.py": _UTILS.replace("TEST", test)}
    assert repo_findings(tmp_path, files, "GT006") == found


def test_a_helper_that_never_unwraps_is_reported(tmp_path: Path) -> None:
    utils = (
        "import torch\n\n\ndef save_checkpoint(path, model, optimizer):\n"
        "    state = model.state_dict()\n    torch.save({'model': state}, path)\n"
    )
    assert repo_findings(tmp_path, {"train.py": _TRAIN, "utils.py": utils}, "GT006") == [
        ("train.py", 13)
    ]
