"""``gpu-training lint`` ``GT002``: the bare ``"cuda"`` of the branch that creates no group.

``if use_distributed: setup(); device = torch.device(f"cuda:{local_rank}")`` with ``else:
device = torch.device("cuda")``: the ``else`` is the one-process run (``setup()`` is where
the group is created), its ``"cuda"`` is that process's only GPU, and every rank of the
distributed run has its own device: no ``set_device`` is missing. Minimal reproduction written
here (issue 33, held-back set 27: a pretraining repository's ``num_dp_ranks > 0`` switch).
A bare ``"cuda"`` on the distributed side keeps the finding.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_TRAIN = """\
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def setup():
    dist.init_process_group("nccl")


parser = argparse.ArgumentParser()
parser.add_argument("--num_dp_ranks", type=int, default=0)
args = parser.parse_args()
use_distributed = args.num_dp_ranks > 0
local_rank = 0
if use_distributed:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    setup()
    device = torch.device(f"cuda:{local_rank}")
else:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
net = torch.nn.Linear(8, 8).to(device)
if use_distributed:
    net = DDP(net, device_ids=[local_rank])
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for x in [torch.randn(2, 8, device=device)] * 4:
    net(x).sum().backward()
    opt.step()
    opt.zero_grad()
if use_distributed:
    dist.destroy_process_group()
"""


def test_the_one_process_branch_needs_no_set_device(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _TRAIN}, "GT002") == []


def test_a_bare_cuda_on_the_distributed_side_keeps_the_finding(tmp_path: Path) -> None:
    train = _TRAIN.replace('torch.device(f"cuda:{local_rank}")', 'torch.device("cuda")')
    assert repo_findings(tmp_path, {"train.py": train}, "GT002") == [("train.py", 21)]
