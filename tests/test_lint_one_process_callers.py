"""``gpu-training lint`` ``GT007``: a helper's write whose unguarded caller runs in one process.

A utilities module the distributed trainers import holds ``update_auto_map(path)``, which
rewrites a model's config file. The trainers call it under ``if state.is_main_process:``; the
module's own ``get_vla(cfg)`` calls it on no guard, but only the one-process evaluation and
serving scripts call ``get_vla``. Every process that rewrites the file is alone: one writer,
no ``GT007``. When a script that creates a process group calls ``get_vla`` too, every rank
of it rewrites the file: reported. Minimal reproductions written here (issue 33, set 24: a
vision-language-action fine-tuning repository).
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_UTILS = """\
import json
import shutil


def update_auto_map(path):
    shutil.copy2(path + "/config.json", path + "/config.json.bak")
    with open(path + "/config.json", "w") as f:
        json.dump({"auto_map": {}}, f)


def get_vla(cfg):
    update_auto_map(cfg.path)
    return cfg.path
"""

_FINETUNE = """\
import torch
import torch.distributed as dist
from accelerate import PartialState
from torch.nn.parallel import DistributedDataParallel as DDP

from robot.utils import update_auto_map


def finetune(path):
    state = PartialState()
    device_id = state.local_process_index
    torch.cuda.set_device(device_id)
    if state.is_main_process:
        update_auto_map(path)
    dist.barrier()
    model = DDP(torch.nn.Linear(2, 2).to(device_id), device_ids=[device_id])
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        model(torch.randn(2, 2)).sum().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    finetune("ckpt")
"""

_EVAL = """\
from types import SimpleNamespace

from robot.utils import get_vla

vla = get_vla(SimpleNamespace(path="ckpt"))
print(vla)
"""

_DISTRIBUTED_EVAL = """\
from types import SimpleNamespace

import torch.distributed as dist

from robot.utils import get_vla

dist.init_process_group("gloo")
vla = get_vla(SimpleNamespace(path="ckpt"))
dist.destroy_process_group()
"""


def _files(evaluation: str) -> dict[str, str]:
    return {
        "robot/__init__.py": "",
        "robot/utils.py": _UTILS,
        "scripts/finetune.py": _FINETUNE,
        "scripts/evaluate.py": evaluation,
        "scripts/serve.py": _EVAL,
    }


def test_a_write_whose_unguarded_caller_runs_alone_is_not_gt007(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, _files(_EVAL), "GT007") == []


def test_the_same_caller_in_a_distributed_script_is_gt007(tmp_path: Path) -> None:
    found = repo_findings(tmp_path, _files(_DISTRIBUTED_EVAL), "GT007")
    assert ("utils.py", 6) in found and ("utils.py", 7) in found
