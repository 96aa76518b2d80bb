"""``gpu-training lint``: ``DataParallel`` as one named mode beside DDP (``GT001``).

A script that picks its wrapper by a string option (``--mode dp`` / ``--mode ddp``) runs
``DataParallel`` only when its user names that mode, and offers the one-process-per-GPU
wrapper in the same ``if``/``elif`` chain. Minimal reproduction written here (issue 33, set 17:
a toy CIFAR script with ``--mode single|dp|ddp``), variants with FSDP, an ``else:`` branch
and a config attribute. The automatic fallback (``if distributed: DDP else: DataParallel``)
and a named mode with no DDP beside it keep the finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_TOY = """\
import argparse
import torch
import torch.nn as nn
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["single", "dp", "ddp"], default="single")
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()
model = nn.Linear(8, 2).cuda()
if args.mode == "dp":
    model = nn.DataParallel(model)
elif args.mode == "ddp":
    dist.init_process_group("nccl")
    torch.cuda.set_device(args.local_rank)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
for x in range(10):
    model(torch.randn(4, 8).cuda()).sum().backward()
    opt.step()
"""

_FSDP = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def wrap(net, cfg):
    if "fsdp" == cfg.strategy:
        dist.init_process_group("nccl")
        return FSDP(net)
    elif cfg.strategy == "dataparallel":
        return torch.nn.DataParallel(net)
    return net


def train(net, cfg, batches):
    net = wrap(net.cuda(), cfg)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr)
    for batch in batches:
        net(batch.cuda()).mean().backward()
        opt.step()
"""

_ELSE = """\
import sys
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
import torch.distributed as dist

backend = sys.argv[1]
net = nn.Linear(8, 2).cuda()
if backend == "data_parallel":
    net = nn.DataParallel(net)
else:
    dist.init_process_group("nccl")
    net = DDP(net)
opt = torch.optim.SGD(net.parameters(), lr=float(sys.argv[2]))
for _ in range(3):
    net(torch.randn(2, 8).cuda()).sum().backward()
    opt.step()
"""


def _gt001(tmp_path: Path, text: str) -> list[int]:
    (tmp_path / "train.py").write_text(text)
    return sorted(f.line for f in lint_paths([tmp_path]).findings if f.code == "GT001")


@pytest.mark.parametrize("text", [_TOY, _FSDP, _ELSE])
def test_a_named_mode_beside_ddp_is_the_users_choice(tmp_path: Path, text: str) -> None:
    assert _gt001(tmp_path, text) == []


def test_the_automatic_fallback_keeps_the_finding(tmp_path: Path) -> None:
    text = _ELSE.replace('backend == "data_parallel"', "not dist.is_available()")
    assert _gt001(tmp_path, text) == [10]


def test_a_named_mode_with_no_ddp_beside_it_keeps_the_finding(tmp_path: Path) -> None:
    text = _TOY.replace("nn.parallel.DistributedDataParallel(", "torch.compile(").replace(
        ", device_ids=[args.local_rank])", ")"
    )
    assert _gt001(tmp_path, text) == [12]
