"""``gpu-training lint``: a checkpoint helper's branches that the call's flags decide.

A project's ``save_checkpoint(model, path, is_fsdp=False, is_ddp=False, rank=0)`` keeps one
branch per layout: the FSDP one gathers the full state inside ``FSDP.state_dict_type(model,
...)`` (a collective), the DDP one saves ``model.module.state_dict()``, the last the plain
model. Called as ``save_checkpoint(model, path, is_ddp=distributed, rank=rank)`` under
``rank == 0``, where the caller wraps in DDP under ``if distributed:``, it runs neither the FSDP
gather (``is_fsdp`` stays False) nor the plain save on the wrapper (that branch runs only
where ``distributed`` is False, the model unwrapped): no ``GT009``, no ``GT006``. Minimal
reproductions written here (issue 33, held-back set 27: a gated-attention trainer with such a
helper, 3 false ``GT009`` and 2 false ``GT006``). The FSDP branch asked for, or the DDP flag
left out, keeps the finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths
from lint_repo import write_repo

_UTILS = """\
import torch
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def save_checkpoint(model, out, is_fsdp=False, is_ddp=False, rank=0):
    if is_fsdp:
        config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
            state = model.state_dict()
            if rank == 0:
                torch.save(state, out)
    elif is_ddp:
        if rank == 0:
            torch.save(model.module.state_dict(), out)
    else:
        if rank == 0:
            torch.save(model.state_dict(), out)
"""

_TRAIN = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from utils import save_checkpoint

distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
rank = 0
if distributed:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = torch.nn.Linear(8, 8).cuda()
if distributed:
    model = DDP(model, device_ids=[torch.cuda.current_device()])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    model(torch.randn(2, 8).cuda()).sum().backward()
    opt.step()
    opt.zero_grad()
    if step % 5 == 0 and rank == 0:
        save_checkpoint(model, "ckpt.pt", is_ddp=distributed, rank=rank)
if distributed:
    dist.destroy_process_group()
"""

_CALL = 'save_checkpoint(model, "ckpt.pt", is_ddp=distributed, rank=rank)'


def _found(tmp_path: Path, call: str = _CALL) -> list[tuple[str, str, int]]:
    files = {"utils.py": _UTILS, "train.py": _TRAIN.replace(_CALL, call)}
    found = lint_paths([write_repo(tmp_path, files)]).findings
    return sorted(
        (f.code, Path(f.path).name, f.line) for f in found if f.code in ("GT006", "GT009")
    )


def test_the_branches_the_flags_leave_report_nothing(tmp_path: Path) -> None:
    assert _found(tmp_path) == []


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (
            'save_checkpoint(model, "ckpt.pt", is_fsdp=True, rank=rank)',
            [("GT006", "train.py", 24), ("GT009", "train.py", 24)],
        ),
        ('save_checkpoint(model, "ckpt.pt", rank=rank)', [("GT006", "train.py", 24)]),
    ],
    ids=["fsdp_branch_taken", "ddp_flag_left_out"],
)
def test_a_branch_the_call_takes_keeps_its_finding(
    tmp_path: Path, call: str, expected: list[tuple[str, str, int]]
) -> None:
    assert _found(tmp_path, call) == expected
