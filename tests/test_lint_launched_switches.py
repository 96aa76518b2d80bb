"""``gpu-training lint``: the branch of a switch that every shipped launch leaves.

``if args.use_lora: ... else: opt = torch.optim.AdamW(model.parameters())`` over a bf16 model
is ``GT019`` in the ``else``, but when every run script of the repository that starts the
file passes ``--use_lora``, the full fine-tune path runs in none of the runs it ships: no
finding there, as for code nothing calls (the LoRA path keeps its own). Minimal
reproductions written here (issue 33, set 25: an image-generation fine-tuning repository
whose launch scripts all pass ``--use_lora``). A launch without the flag (a commented-out one does not count), or no
launch at all, keeps the finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_TRAIN = """\
import argparse
import os

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--use_lora", action="store_true")
parser.add_argument("--lr", type=float, default=1e-4)
args = parser.parse_args()
dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
model = torch.nn.Linear(8, 8).cuda().to(torch.bfloat16)
if args.use_lora:
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["qkv"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
else:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
model = DDP(model, device_ids=[rank])
for batch in [torch.randn(2, 8)] * 4:
    model(batch.cuda().to(torch.bfloat16)).float().sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""

_LORA = "torchrun --nproc_per_node=2 \\\n    train.py \\\n    --lr 3e-4 \\\n    --use_lora\n"


def test_the_branch_no_launch_takes_reports_nothing(tmp_path: Path) -> None:
    files = {"train.py": _TRAIN, "scripts/lora.sh": _LORA, "scripts/lora_big.sh": _LORA}
    assert repo_findings(tmp_path, files, "GT019") == [("train.py", 19)]  # the LoRA path's


@pytest.mark.parametrize(
    "scripts",
    [
        {
            "scripts/lora.sh": _LORA,
            "scripts/full.sh": "torchrun --nproc_per_node=8 train.py --lr 1e-5\n",
        },
        {
            "scripts/lora.sh": "# torchrun --nproc_per_node=8 train.py --lr 1e-5 --use_lora\n"
            + _LORA.replace(" \\\n    --use_lora", "")
        },
        {},
    ],
    ids=["a_launch_without_it", "the_only_launch_without_it", "no_launch"],
)
def test_a_branch_a_launch_may_take_keeps_its_finding(
    tmp_path: Path, scripts: dict[str, str]
) -> None:
    assert repo_findings(tmp_path, {"train.py": _TRAIN, **scripts}, "GT019") == [
        ("train.py", 19),
        ("train.py", 21),
    ]
