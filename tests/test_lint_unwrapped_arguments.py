"""``gpu-training lint`` ``GT020``: a loss function handed the module inside the DDP wrapper.

``loss = compute_loss(accelerator.unwrap_model(system), batch)`` (or ``fit(model.module, x)``
under plain DDP) runs the forward inside ``compute_loss`` on the unwrapped module: the DDP
reducer is never armed, no gradient is all-reduced, and the replicas drift apart with no
error. Minimal reproduction written here (issue 33, held-back set 26: a ControlNet trainer
under ``accelerate launch --num_processes=8`` whose step computed its flow-matching loss that
way). A helper that only reads the module's attributes, or a step that also runs the wrapper's
own forward, reports nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_ACCELERATE = """\
import torch
from accelerate import Accelerator


def compute_loss(system, batch, scale=1.0):
    latent = system.encode(batch)
    pred = system(latent)
    return scale * ((pred - batch) ** 2).mean()


def lr_for(system, batch):
    return 1e-4 * system.config_scale


accelerator = Accelerator()
system = torch.nn.Linear(8, 8)
opt = torch.optim.AdamW(system.parameters(), lr=1e-4)
system, opt = accelerator.prepare(system, opt)
for batch in [torch.randn(2, 8)] * 4:
    loss = compute_loss(accelerator.unwrap_model(system), batch)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
"""

_DDP = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def fit_step(net, x):
    return net(x).pow(2).mean()


dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
model = DDP(torch.nn.Linear(8, 8).cuda(), device_ids=[rank])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in [torch.randn(2, 8).cuda()] * 4:
    loss = fit_step(net=model.module, x=x)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""

_LAUNCH = {"run.sh": "accelerate launch --num_processes 8 train.py\n"}


def test_a_loss_function_given_the_unwrapped_model_is_reported(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _ACCELERATE, **_LAUNCH}, "GT020") == [
        ("train.py", 20)
    ]


def test_the_module_passed_by_keyword_under_ddp_is_reported(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _DDP}, "GT020") == [("train.py", 18)]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "    loss = compute_loss(accelerator.unwrap_model(system), batch)\n",
            "    loss = lr_for(accelerator.unwrap_model(system), batch) * system(batch).sum()\n",
        ),
        (
            "    loss = compute_loss(accelerator.unwrap_model(system), batch)\n",
            "    loss = compute_loss(accelerator.unwrap_model(system), batch) + system(batch).sum()\n",
        ),
    ],
    ids=["attributes_only", "wrapper_forward_too"],
)
def test_no_forward_of_the_inner_module_or_the_wrapper_run_too(
    tmp_path: Path, old: str, new: str
) -> None:
    files = {"train.py": _ACCELERATE.replace(old, new), **_LAUNCH}
    assert repo_findings(tmp_path, files, "GT020") == []
