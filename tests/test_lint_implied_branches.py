"""``gpu-training lint``: what one branch of an ``if`` says about a later test (round 27).

Issue 33, the fourth and third random samples of findings (``benchmarks/lint_ddpsample4_triage.csv``,
``lint_ddpsample3_triage.csv``): three readings the lint made of real code that the code does
not support. Minimal reproductions written here, each with a variant that stays reported.

- A re-identification training loop wraps the model under ``torch.cuda.device_count() > 1 and
  cfg.MODEL.DIST_TRAIN`` and saves ``model.state_dict()`` in the ``else`` of ``if
  cfg.MODEL.DIST_TRAIN:``; the save sees the plain model (``GT006`` was reported), in the same
  function or in a helper the wrapping code calls with the same ``cfg``.
- An evaluation returns early with ``if not use_fsdp_eval and not is_rank0: return``; a
  broadcast under ``if use_fsdp_eval:`` after it is reached by every rank (``GT009`` was
  reported: a collective only rank 0 reaches).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_LAUNCH = """\
import os
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from config import cfg
from processor import do_train

if __name__ == "__main__":
    if cfg.MODEL.DIST_TRAIN:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend="nccl", init_method="env://")
    data = list(range(10))
    sampler = DistributedSampler(data) if cfg.MODEL.DIST_TRAIN else None
    loader = DataLoader(data, sampler=sampler)
    model = torch.nn.Linear(2, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    do_train(cfg, model, loader, optimizer)
"""

_IN_ONE_FUNCTION = """\
import os
import torch
import torch.distributed as dist


def do_train(cfg, model, loader, optimizer):
    if torch.cuda.device_count() > 1 and cfg.MODEL.DIST_TRAIN:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[cfg.LOCAL_RANK])
    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        if cfg.MODEL.DIST_TRAIN:
            if dist.get_rank() == 0:
                torch.save(model.state_dict(), os.path.join(cfg.OUTPUT_DIR, "m.pth"))
        else:
            torch.save(model.state_dict(), os.path.join(cfg.OUTPUT_DIR, "m.pth"))
"""


def test_a_save_on_the_other_side_of_a_wrapping_conjunct_sees_the_plain_model(
    tmp_path: Path,
) -> None:
    files = {"processor.py": _IN_ONE_FUNCTION, "train.py": _LAUNCH, "config.py": "cfg = 1\n"}
    # the guarded save (line 16) saves the wrapper: the one true finding
    assert repo_findings(tmp_path, files, "GT006") == [("processor.py", 16)]


def test_a_save_the_wrapping_test_does_not_decide_stays_reported(tmp_path: Path) -> None:
    # `else` of another flag: the model may be wrapped there
    other = _IN_ONE_FUNCTION.replace("if cfg.MODEL.DIST_TRAIN:\n", "if cfg.MODEL.EMA:\n")
    files = {"processor.py": other, "train.py": _LAUNCH, "config.py": "cfg = 1\n"}
    assert repo_findings(tmp_path, files, "GT006") == [("processor.py", 16), ("processor.py", 18)]


_HELPER = """\
import os
import torch
import torch.distributed as dist


def do_epoch(epoch, cfg, model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    if cfg.MODEL.DIST_TRAIN:
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), os.path.join(cfg.OUTPUT_DIR, "m.pth"))
    else:
        torch.save(model.state_dict(), os.path.join(cfg.OUTPUT_DIR, "m.pth"))
"""

_CALLER = """\
import os
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from config import cfg
from processor import do_epoch

if __name__ == "__main__":
    if cfg.MODEL.DIST_TRAIN:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend="nccl", init_method="env://")
    data = list(range(10))
    sampler = DistributedSampler(data) if cfg.MODEL.DIST_TRAIN else None
    loader = DataLoader(data, sampler=sampler)
    model = torch.nn.Linear(2, 2).cuda()
    if torch.cuda.device_count() > 1 and cfg.MODEL.DIST_TRAIN:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        do_epoch(epoch, CFG, model, loader, optimizer)
"""


def _helper_files(passed: str, helper: str = _HELPER) -> dict[str, str]:
    return {
        "processor.py": helper,
        "train.py": _CALLER.replace("CFG", passed),
        "config.py": "cfg = 1\nother = 2\n",
    }


def test_a_helper_saving_on_the_other_side_of_the_callers_wrapping_test_is_not_reported(
    tmp_path: Path,
) -> None:
    assert repo_findings(tmp_path, _helper_files("cfg"), "GT006") == []


@pytest.mark.parametrize(
    ("passed", "helper"),
    [
        ("cfg", _HELPER.replace("    if cfg.MODEL.DIST_TRAIN:\n", "    if cfg.MODEL.EMA:\n")),
        ("cfg.clone()", _HELPER),  # another object: its flag says nothing of the caller's
    ],
    ids=["another-flag", "another-config"],
)
def test_a_helper_save_the_callers_test_does_not_decide_stays_reported(
    tmp_path: Path, passed: str, helper: str
) -> None:
    assert repo_findings(tmp_path, _helper_files(passed, helper), "GT006") == [("train.py", 21)]


_EVALUATE = """\
import torch
import torch.distributed as dist


def evaluate(model, loader, args):
    use_fsdp_eval = args.fsdp and args.distributed
    is_rank0 = dist.get_rank() == 0
    if not use_fsdp_eval and not is_rank0:
        return {}
    signal = torch.zeros(1)
    batches = iter(loader) if is_rank0 else None
    if use_fsdp_eval:
        while True:
            if is_rank0:
                batch = next(batches, None)
                signal.fill_(0 if batch is None else 1)
            dist.broadcast(signal, src=0)
            if signal.item() == 0:
                break
    LATER
    return {}


def main(args, model, loader):
    dist.init_process_group("nccl")
    for epoch in range(2):
        evaluate(model, loader, args)
    dist.destroy_process_group()
"""


def test_a_collective_under_the_flag_that_kept_every_rank_is_reached_by_all(
    tmp_path: Path,
) -> None:
    files = {"evaluate.py": _EVALUATE.replace("    LATER\n", "")}
    assert repo_findings(tmp_path, files, "GT009") == []


@pytest.mark.parametrize(
    ("later", "line"),
    [
        ("    dist.barrier()\n", 20),  # after the flag's branch: rank 0 alone without the flag
        ("    use_fsdp_eval = True\n    if use_fsdp_eval:\n        dist.barrier()\n", 22),
    ],
    ids=["outside-the-flag", "flag-reassigned"],
)
def test_a_collective_the_flag_does_not_cover_stays_reported(
    tmp_path: Path, later: str, line: int
) -> None:
    files = {"evaluate.py": _EVALUATE.replace("    LATER\n", later)}
    assert ("evaluate.py", line) in repo_findings(tmp_path, files, "GT009")
