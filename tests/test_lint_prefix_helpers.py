"""``gpu-training lint`` ``GT006``: the project's loader strips ``module.`` through a helper.

A script that saves ``ddp_model.state_dict()`` writes keys with ``module.``; when the script's
own loading path removes the prefix before ``load_state_dict``, its checkpoints load back and
``GT006`` has nothing to report. The stripping is often in a helper: ``load_checkpoint(...)``
returns ``remove_ddp_in_checkpoint(torch.load(path))``, which slices ``k[7:]``; or the loader
slices ``k[len("module."):]``. Minimal reproductions written here (issue 33, set 24: a
vision-language-action fine-tuning script and a multi-label classifier). A helper that strips
but whose result no loader reads leaves the finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_TRAIN = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ckpt import load_checkpoint, remove_ddp_in_checkpoint

dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
head = torch.nn.Linear(4, 4).cuda()
if os.environ.get("RESUME"):
    {load}
head = DDP(head, device_ids=[rank])
opt = torch.optim.AdamW(head.parameters())
for step in range(10):
    head(torch.randn(2, 4).cuda()).sum().backward()
    opt.step()
    if dist.get_rank() == 0:
        torch.save(head.state_dict(), f"head--{step}_checkpoint.pt")
dist.destroy_process_group()
"""

_CKPT = """\
import torch


def remove_ddp_in_checkpoint(state_dict):
    new_state_dict = {}
    for k, v in state_dict.items():
        if k[:7] == "module.":
            new_state_dict[k[7:]] = v
        else:
            new_state_dict[k] = v
    return new_state_dict


def load_checkpoint(path):
    state_dict = torch.load(path, weights_only=True, map_location="cpu")
    return remove_ddp_in_checkpoint(state_dict)
"""

_LOADS = {
    "helper_of_helper": 'head.load_state_dict(load_checkpoint("head--9_checkpoint.pt"))',
    "helper": (
        'head.load_state_dict(remove_ddp_in_checkpoint(torch.load("head--9_checkpoint.pt")))'
    ),
    "len_slice": (
        'sd = torch.load("head--9_checkpoint.pt")\n'
        "    head.load_state_dict({k[len('module.'):]: v for k, v in sd.items()})"
    ),
}


@pytest.mark.parametrize("load", sorted(_LOADS))
def test_a_loader_that_strips_the_prefix_reads_it_back(tmp_path: Path, load: str) -> None:
    train = _TRAIN.replace("{load}", _LOADS[load])
    assert repo_findings(tmp_path, {"train.py": train, "ckpt.py": _CKPT}, "GT006") == []


def test_a_stripping_helper_no_loader_calls_keeps_gt006(tmp_path: Path) -> None:
    train = _TRAIN.replace("{load}", 'head.load_state_dict(torch.load("head--9_checkpoint.pt"))')
    found = repo_findings(tmp_path, {"train.py": train, "ckpt.py": _CKPT}, "GT006")
    assert found == [("train.py", 21)]
