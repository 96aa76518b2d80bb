"""``gpu-training lint`` ``GT017``: one writer per node, however the node-local index reaches the guard.

A write under a guard that reads the rank *within the node* (``LOCAL_RANK``, ``local_rank``,
``is_local_process_zero``, ``local_process_index``) runs once per node, and every node writes the
same path. Issue 33, set 13: a config copied with ``shutil.copyfile`` under ``cfg.dist["local_rank"]
== 0``, a ``TrainerCallback`` appending under ``state.is_local_process_zero``, and a
``shutil.copy`` under a helper ``is_main_process(args.local_rank)`` in a script the repository
launches with ``deepspeed --num_gpus=2``. Minimal reproductions written here, with variants in
other frameworks; not reported: a copy onto the node's own disk (``$SLURM_TMPDIR``, ``/dev/shm``),
a path that carries the rank, and a one-GPU script whose ``--local_rank`` nothing launches.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_DEEPSPEED_CONFIG_COPY = """\
import os
import shutil
import deepspeed
import torch


def init_dist(cfg):
    cfg["dist"] = dict(
        world_size=int(os.getenv("WORLD_SIZE", 1)),
        local_rank=int(os.getenv("LOCAL_RANK", 0)) % torch.cuda.device_count(),
    )
    torch.cuda.set_device(cfg["dist"]["local_rank"])
    deepspeed.init_distributed()


def main(cfg, cfg_path, out_dir):
    init_dist(cfg)
    if cfg["dist"]["local_rank"] == 0:
        shutil.copyfile(cfg_path, os.path.join(out_dir, "config.py"))


if __name__ == "__main__":
    main({}, "configs/base.py", "runs/x")
"""

_HF_CALLBACK = """\
import json
from transformers import TrainerCallback


class SampleWriter(TrainerCallback):
    def __init__(self, result_path):
        self.result_path = result_path

    def on_log(self, args, state, control, **kwargs):
        if state.is_local_process_zero:
            with open(self.result_path, "a") as out:
                out.write(json.dumps({state.global_step: "sample"}))
"""

_UTILS = """\
import os


def is_main_process(local_rank=None):
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", -1))
    return local_rank in (-1, 0)
"""

_LAUNCHED_TRAINER = """\
import shutil
from argparse import ArgumentParser
from pathlib import Path

from transformers import Trainer, TrainingArguments

from utils import is_main_process

if __name__ == "__main__":
    parser = ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    result_dir = Path("results") / "run"
    if is_main_process(args.local_rank):
        result_dir.mkdir()
        shutil.copy(args.config, result_dir / "config.yaml")
    trainer = Trainer(model=None, args=TrainingArguments(output_dir=str(result_dir)))
    trainer.train()
"""

_ACCELERATE = """\
import shutil
from accelerate import Accelerator


def main(model, loader, optimizer, run_dir):
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if accelerator.is_local_main_process:
        shutil.copytree("configs", run_dir + "/configs")
    for batch in loader:
        accelerator.backward(model(batch).loss)
        optimizer.step()


main(build_model(), build_loader(), None, "runs/x")
"""

_TORCHRUN_STAGING = """\
import os
import shutil
import torch
import torch.distributed as dist


def main(dataset_zip, out):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    if local_rank == 0:
        shutil.copy(dataset_zip, {destination})
    dist.barrier()


if __name__ == "__main__":
    main("data.zip", "runs/x")
"""

_ONE_GPU_SCRIPT = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()
model = torch.nn.Linear(4, 1).cuda()
for epoch in range(3):
    model(torch.randn(2, 4).cuda()).sum().backward()
    if args.local_rank == 0:
        torch.save(model.state_dict(), "ckpt.pt")
"""


def _gt017(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT017")


def test_a_config_dict_holding_local_rank(tmp_path: Path) -> None:
    assert _gt017(tmp_path, {"train.py": _DEEPSPEED_CONFIG_COPY}) == [("train.py", 19)]


def test_a_trainer_callback_under_the_local_process_flag(tmp_path: Path) -> None:
    assert _gt017(tmp_path, {"callback.py": _HF_CALLBACK}) == [("callback.py", 11)]


def test_a_helper_guard_in_a_script_the_repository_launches(tmp_path: Path) -> None:
    files = {
        "utils.py": _UTILS,
        "trainer.py": _LAUNCHED_TRAINER,
        "train.sh": "deepspeed --num_gpus=2 trainer.py --config cfg.yaml\n",
    }
    assert _gt017(tmp_path, files) == [("trainer.py", 17)]


def test_accelerates_local_main_process_copying_a_tree(tmp_path: Path) -> None:
    assert _gt017(tmp_path, {"train.py": _ACCELERATE}) == [("train.py", 9)]


def test_a_copy_to_the_shared_run_directory(tmp_path: Path) -> None:
    text = _TORCHRUN_STAGING.format(destination="out")
    assert _gt017(tmp_path, {"train.py": text}) == [("train.py", 12)]


@pytest.mark.parametrize(
    "destination",
    [
        'os.environ["SLURM_TMPDIR"]',
        'os.path.join(os.getenv("LSCRATCH"), "data")',
        '"/dev/shm/data.zip"',
        'f"{out}/data.rank{local_rank}.zip"',
    ],
)
def test_the_nodes_own_disk_or_a_rank_path_is_not_shared(tmp_path: Path, destination: str) -> None:
    text = _TORCHRUN_STAGING.format(destination=destination)
    assert _gt017(tmp_path, {"train.py": text}) == []


def test_a_one_gpu_script_whose_local_rank_nothing_launches(tmp_path: Path) -> None:
    assert _gt017(tmp_path, {"train_single_gpu.py": _ONE_GPU_SCRIPT}) == []


def test_the_same_script_launched_once_per_gpu(tmp_path: Path) -> None:
    files = {
        "train_single_gpu.py": _ONE_GPU_SCRIPT,
        "run.sh": "torchrun --nnodes 2 --nproc_per_node 4 train_single_gpu.py\n",
    }
    assert _gt017(tmp_path, files) == [("train_single_gpu.py", 11)]
