"""``gpu-training lint`` ``GT006``: the plain branch of a save that unwraps under the script's
own flag.

``torch.save(model.module.state_dict() if cfg["DDP"] else model.state_dict(), path)`` in a
script that wraps ``model`` in DDP only under the same flag: the branch that reads
``model.state_dict()`` runs when the model is not wrapped, so no key gets a ``module.``
prefix. A save of the wrapper's ``state_dict()`` with no such branch stays ``GT006``.
Minimal reproductions written here (issue 33, set 14), with variants.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_SCRIPT = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(cfg, model, loader):
    use_ddp = cfg["DDP"]
    if use_ddp:
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        model = DDP(model.cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    if not use_ddp or dist.get_rank() == 0:
        torch.save({save}, "model.pth")
    if use_ddp:
        dist.destroy_process_group()
"""

_SAVES = {
    "flag": 'model.module.state_dict() if cfg["DDP"] else model.state_dict()',
    "local_flag": "model.module.state_dict() if use_ddp else model.state_dict()",
    "negated": "model.state_dict() if not use_ddp else model.module.state_dict()",
    "in_a_dict": '{"model": model.module.state_dict() if use_ddp else model.state_dict()}',
}


def _codes(tmp_path: Path, save: str) -> set[str]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(_SCRIPT.replace("{save}", save))
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {f.code for f in report.findings}


@pytest.mark.parametrize("save", sorted(_SAVES))
def test_the_plain_branch_of_a_flagged_unwrap_is_not_gt006(tmp_path: Path, save: str) -> None:
    assert "GT006" not in _codes(tmp_path, _SAVES[save])


def test_the_wrapper_state_without_an_unwrapping_branch_is_gt006(tmp_path: Path) -> None:
    assert "GT006" in _codes(tmp_path, "model.state_dict()")
