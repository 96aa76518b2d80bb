"""``gpu-training lint`` ``GT006``: a ``state_dict()`` read where the model is not wrapped.

``if hasattr(model, "module"): sd = model.module.state_dict() else: sd = model.state_dict()``
saves the inner module's keys under DDP and the plain model's in one process: the ``else``
never reads a wrapper. So do ``if not hasattr(...)``, the ``else`` of ``isinstance(model,
DDP)``, and a conditional expression. Minimal reproductions written here (issue 33, set 25:
an image-generation fine-tuning script under Accelerate). A save with no such test, or one
whose test is about another object, keeps the finding.
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

dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
model = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[rank])
other = torch.nn.Linear(4, 4)
opt = torch.optim.AdamW(model.parameters())
for step in range(10):
    model(torch.randn(2, 4).cuda()).sum().backward()
    opt.step()
{save}
dist.destroy_process_group()
"""

_GUARDED = {
    "hasattr_else": (
        "if hasattr(model, 'module'):\n    sd = model.module.state_dict()\n"
        "else:\n    sd = model.state_dict()\n"
    ),
    "not_hasattr": (
        "if not hasattr(model, 'module'):\n    sd = model.state_dict()\n"
        "else:\n    sd = model.module.state_dict()\n"
    ),
    "isinstance_else": (
        "if isinstance(model, DDP):\n    sd = model.module.state_dict()\n"
        "else:\n    sd = model.state_dict()\n"
    ),
    "conditional": "sd = model.module.state_dict() if hasattr(model, 'module') else model.state_dict()\n",
}
_SAVE = "if dist.get_rank() == 0:\n    torch.save(sd, 'ckpt.pt')"


def _gt006(tmp_path: Path, save: str) -> list[int]:
    (tmp_path / "train.py").write_text(_SCRIPT.replace("{save}", save + _SAVE))
    report = lint_paths([tmp_path / "train.py"])
    assert not report.errors, report.errors
    return [f.line for f in report.findings if f.code == "GT006"]


@pytest.mark.parametrize("case", sorted(_GUARDED))
def test_a_state_dict_read_where_the_model_is_unwrapped_is_not_gt006(
    tmp_path: Path, case: str
) -> None:
    assert _gt006(tmp_path, _GUARDED[case]) == []


@pytest.mark.parametrize(
    "save",
    [
        "sd = model.state_dict()\n",
        "if hasattr(other, 'module'):\n    sd = other.state_dict()\nelse:\n    sd = model.state_dict()\n",
    ],
    ids=["no_test", "another_object"],
)
def test_the_wrapper_read_anyway_keeps_gt006(tmp_path: Path, save: str) -> None:
    assert _gt006(tmp_path, save) != []
