"""``gpu-training lint`` ``GT013``: a micro-batch loop whose backward runs in a helper.

``for micro_step in range(accum): train_step(model, next(it), accum)`` and one
``optimizer.step()`` after the loop: ``train_step`` divides the loss and calls
``loss.backward()`` on the DDP model, so every micro-batch all-reduces, as when the backward is
written in the loop. Minimal reproduction written here (issue 33, held-back set 27: a
gated-attention trainer accumulating 32 micro-batches this way under its DDP launch). A loop
inside ``no_sync()``, or a helper that steps the optimizer itself, reports nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_TRAIN = """\
import os

import torch
import torch.distributed as dist
import yaml
from torch.nn.parallel import DistributedDataParallel as DDP


def train_step(model, batch, accum):
    loss = model(batch).sum() / accum
    loss.backward()
    return loss.item()


def main():
    cfg = yaml.safe_load(open("config.yaml"))
    accum = cfg["training"]["gradient_accumulation_steps"]
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(8, 8).cuda(), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    it = iter([torch.randn(2, 8).cuda()] * 100)
    for step in range(10):
        for micro_step in range(accum):
            train_step(model, next(it), accum)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

_CONFIG = "training:\n  gradient_accumulation_steps: 32\n"


def test_a_helper_backward_in_a_micro_batch_loop_is_reported(tmp_path: Path) -> None:
    files = {"train.py": _TRAIN, "config.yaml": _CONFIG}
    assert repo_findings(tmp_path, files, "GT013") == [("train.py", 26)]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "            train_step(model, next(it), accum)\n",
            "            with model.no_sync():\n                train_step(model, next(it), accum)\n",
        ),
        ("    loss.backward()\n", "    loss.backward()\n    model.optimizer.step()\n"),
    ],
    ids=["no_sync", "helper_steps"],
)
def test_a_synchronised_or_stepping_helper_reports_nothing(
    tmp_path: Path, old: str, new: str
) -> None:
    files = {"train.py": _TRAIN.replace(old, new), "config.yaml": _CONFIG}
    assert repo_findings(tmp_path, files, "GT013") == []
