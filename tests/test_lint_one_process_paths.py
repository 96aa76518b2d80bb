"""``gpu-training lint``: what follows a check that stops the other launches runs in one process.

A repository whose trainer shards its data (``DistributedSampler``) is a distributed project,
so a plain shuffled ``DataLoader`` elsewhere in it is ``GT003``, unless the script refuses to
run in a world of more than one process first: ``if world_size != 1: raise``, ``if
dist.get_world_size() > 1: sys.exit(1)``. After such a check the loader only ever runs in one
process. Without the check the finding stays. Minimal reproductions written here (issue 33,
set 12: a single-GPU DeepSpeed benchmark beside the multi-GPU scripts).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_TRAINER = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def main(dataset):
    dist.init_process_group("nccl")
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(4, 1).cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(build_dataset())
"""

_DEEPSPEED_ONE_GPU = """\
import deepspeed
import torch.distributed as dist
from torch.utils.data import DataLoader


def main(args, model):
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )
    world_size = dist.get_world_size() if dist.is_initialized() else 1
{check}    loader = DataLoader(build_dataset(), batch_size=4, shuffle=True, drop_last=True)
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    main(parse_args(), build_model())
"""

_DDP_ONE_PROCESS = """\
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader


def probe():
    dist.init_process_group("gloo")
{check}    loader = DataLoader(build_dataset(), batch_size=8, shuffle=True)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    probe()
"""

_CHECKS = {
    "raise_unless_one": (
        _DEEPSPEED_ONE_GPU,
        "    if world_size != 1:\n        raise RuntimeError('one GPU only')\n",
    ),
    "raise_when_more": (
        _DEEPSPEED_ONE_GPU,
        "    if world_size > 1:\n        raise SystemExit('one GPU only')\n",
    ),
    "exit_on_group_size": (
        _DDP_ONE_PROCESS,
        "    if dist.get_world_size() > 1:\n        print('one process only')\n        sys.exit(1)\n",
    ),
    "raise_on_group_size_not_one": (
        _DDP_ONE_PROCESS,
        "    if dist.get_world_size() != 1:\n        raise ValueError('run without torchrun')\n",
    ),
}


def _repository(tmp_path: Path, script: str) -> Path:
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(_TRAINER)
    (tmp_path / "bench.py").write_text(script)
    return tmp_path


def _codes(root: Path, name: str) -> set[tuple[int, str]]:
    report = lint_paths([root])
    assert not report.errors, report.errors
    return {(f.line, f.code) for f in report.findings if Path(f.path).name == name}


@pytest.mark.parametrize("case", sorted(_CHECKS))
def test_a_loader_after_a_one_process_check_is_not_gt003(tmp_path: Path, case: str) -> None:
    template, check = _CHECKS[case]
    root = _repository(tmp_path, template.format(check=check))
    assert not {code for _, code in _codes(root, "bench.py")} & {"GT003", "GT009", "GT007"}


@pytest.mark.parametrize("template", [_DEEPSPEED_ONE_GPU, _DDP_ONE_PROCESS])
def test_the_same_loader_without_the_check_is_gt003(tmp_path: Path, template: str) -> None:
    root = _repository(tmp_path, template.format(check=""))
    assert "GT003" in {code for _, code in _codes(root, "bench.py")}


def test_a_check_that_holds_in_a_group_does_not_make_one_process(tmp_path: Path) -> None:
    check = "    if dist.get_world_size() != 2:\n        raise RuntimeError('needs two GPUs')\n"
    root = _repository(tmp_path, _DDP_ONE_PROCESS.format(check=check))
    assert "GT003" in {code for _, code in _codes(root, "bench.py")}
