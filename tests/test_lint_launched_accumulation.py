"""``gpu-training lint`` ``GT013``: an accumulation count every shipped launch sets to 1.

A loop that steps under ``if (i + 1) % args.<flag> == 0:`` accumulates only when the flag is
above 1. When every shell script of the repository that runs the file passes the flag as
``1``, the shipped runs step on every micro-batch: no window, nothing for ``no_sync()`` to
save. A script that passes another value, or none that passes the flag, keeps the finding.
Minimal reproductions written here (issue 33, set 14: diffusion training scripts launched
with ``--gradient_accumulation_steps 1``). So does a config field that defaults to 1 and that
no script, document or config of the repository names (set 24: a robot-policy fine-tuning
script whose documented launches never set ``grad_accumulation_steps``); a default above 1, a
README or config that sets it, or the run assigning it (a sweep) keeps the finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_ACCELERATE = """\
import argparse

import torch
from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
parser.add_argument("--checkpointing_steps", type=int, default=500)
args = parser.parse_args()
accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.AdamW(model.parameters())
loader = torch.utils.data.DataLoader(list(range(32)), batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
step = 0
for batch in loader:
    loss = model(batch).mean() / args.gradient_accumulation_steps
    accelerator.backward(loss)
    step += 1
    if step % args.gradient_accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
    if step % args.checkpointing_steps == 0 and accelerator.is_main_process:
        accelerator.save_state("ckpt")
"""

_DDP = """\
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--grad-accum", type=int, default=8)
opts = parser.parse_args()
dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
net = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[rank])
opt = torch.optim.SGD(net.parameters(), lr=0.1)
data = list(range(64))
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=DistributedSampler(data))
for it, batch in enumerate(loader):
    net(batch.cuda()).sum().backward()
    if (it + 1) % opts.grad_accum == 0:
        opt.step()
        opt.zero_grad()
dist.destroy_process_group()
"""

_ONE = {
    "accelerate_space": (
        _ACCELERATE,
        {
            "run.sh": "accelerate launch --multi_gpu train.py \\\n"
            "  --gradient_accumulation_steps 1 --checkpointing_steps 1000\n"
        },
    ),
    "ddp_hyphen_equals": (
        _DDP,
        {"scripts/launch.sh": "torchrun --nproc_per_node 8 train.py --grad-accum=1\n"},
    ),
    "two_scripts": (
        _ACCELERATE,
        {
            "a.sh": "accelerate launch train.py --gradient_accumulation_steps 1\n",
            "b.bash": "accelerate launch train.py --gradient_accumulation_steps=1 --seed 3\n",
        },
    ),
}


def _codes(tmp_path: Path, source: str, scripts: dict[str, str]) -> set[str]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(source)
    for name, text in scripts.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {f.code for f in report.findings}


@pytest.mark.parametrize("case", sorted(_ONE))
def test_an_accumulation_count_launched_as_one_is_not_gt013(tmp_path: Path, case: str) -> None:
    source, scripts = _ONE[case]
    assert "GT013" not in _codes(tmp_path, source, scripts)


def test_a_script_that_accumulates_keeps_gt013(tmp_path: Path) -> None:
    scripts = {
        "a.sh": "accelerate launch train.py --gradient_accumulation_steps 1\n",
        "b.sh": "accelerate launch train.py --gradient_accumulation_steps 4\n",
    }
    assert "GT013" in _codes(tmp_path, _ACCELERATE, scripts)


def test_no_script_passing_the_flag_keeps_gt013(tmp_path: Path) -> None:
    assert "GT013" in _codes(tmp_path, _DDP, {"run.sh": "torchrun --nproc_per_node 8 train.py\n"})


_CONFIGURED = """\
from dataclasses import dataclass

import draccus
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class FinetuneConfig:
    batch_size: int = 8
    grad_accumulation_steps: int = 1


@draccus.wrap()
def finetune(cfg: FinetuneConfig) -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank() % torch.cuda.device_count()
    torch.cuda.set_device(rank)
    net = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[rank])
    opt = torch.optim.AdamW(net.parameters())
    for batch_idx, batch in enumerate([torch.randn(8, 4)] * 16):
        (net(batch.cuda()).sum() / cfg.grad_accumulation_steps).backward()
        if (batch_idx + 1) % cfg.grad_accumulation_steps == 0:
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    finetune()
"""


def test_a_default_of_one_that_nothing_sets_is_not_gt013(tmp_path: Path) -> None:
    docs = {"README.md": "torchrun --nproc-per-node 8 train.py --batch_size 4\n"}
    assert "GT013" not in _codes(tmp_path, _CONFIGURED, docs)


@pytest.mark.parametrize(
    ("source", "files"),
    [
        (_CONFIGURED, {"README.md": "torchrun train.py --grad_accumulation_steps 4\n"}),
        (_CONFIGURED, {"configs/large.yaml": "grad_accumulation_steps: 16\n"}),
        (_CONFIGURED.replace("steps: int = 1", "steps: int = 4"), {}),
        (
            _CONFIGURED.replace(
                "    dist.init_process_group",
                "    cfg.grad_accumulation_steps = sweep.grad_accumulation_steps\n"
                "    dist.init_process_group",
            ),
            {},
        ),
    ],
    ids=["readme_sets_it", "config_sets_it", "default_four", "sweep_sets_it"],
)
def test_a_count_a_run_may_set_keeps_gt013(
    tmp_path: Path, source: str, files: dict[str, str]
) -> None:
    assert "GT013" in _codes(tmp_path, source, files)
