"""``gpu-training lint``: the launcher's local rank and the launcher's distributed type.

Issue 33, sets 14 and 15.

* ``GT017``: a script that reads the launcher's ``LOCAL_RANK`` (or takes ``--local_rank``)
  and passes it to ``init_process_group(rank=...)`` still means the index within the node:
  its ``if local_rank == 0:`` writes are one per node (the group forms only on one node,
  and the fix, the global rank, is the same). A spawn worker's index that makes the group's
  rank stays the global rank of a one-machine group.
* ``GT009``: ``accelerate launch --multi_gpu`` in the repository's shell scripts (no config
  file) is plain DDP, under which ``save_state`` on the main process synchronises nothing;
  ``--use_deepspeed``/``--use_fsdp`` (or a config the repository does not hold) keep it a
  collective.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_TORCHRUN = """\
import os
import torch.distributed as dist


def save_model(local_rank, model, outpath, step):
    if local_rank == 0:
        outpath += f"/step_{step}"
        model.save_pretrained(outpath)


def main(model, output_dir):
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl", rank=local_rank, world_size=int(os.environ["WORLD_SIZE"]))
    save_model(local_rank, model, output_dir, 1)


if __name__ == "__main__":
    main(None, "out")
"""

_LAUNCH_ARGUMENT = """\
import argparse
import json
from pathlib import Path

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--local-rank", "--local_rank", type=int, default=-1)
parser.add_argument("--save-dir", default="save")
args = parser.parse_args()
if args.local_rank != -1:
    torch.distributed.init_process_group(backend="nccl", rank=args.local_rank)
save_dir = Path(args.save_dir)
if args.local_rank in [0, -1]:
    with open(save_dir / "args.json", "w") as f:
        json.dump(vars(args), f)
"""

_SPAWN = """\
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(local_rank, ngpus, model):
    dist.init_process_group("nccl", rank=local_rank, world_size=ngpus)
    if local_rank == 0:
        torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    n = torch.cuda.device_count()
    mp.spawn(worker, nprocs=n, args=(n, None))
"""

_ACCELERATE = """\
from accelerate import Accelerator


def main(model, loader, optimizer, output_dir):
    accelerator = Accelerator()
    model, loader, optimizer = accelerator.prepare(model, loader, optimizer)
    for step, batch in enumerate(loader):
        accelerator.backward(model(batch).loss)
        optimizer.step()
        if accelerator.is_main_process and step % 100 == 0:
            accelerator.save_state(f"{output_dir}/checkpoint-{step}")


if __name__ == "__main__":
    main(None, None, None, "out")
"""


def test_a_torchrun_local_rank_given_as_the_group_rank(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _TORCHRUN}, "GT017") == [("train.py", 8)]


def test_the_launch_argument_given_as_the_group_rank(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"pretrain.py": _LAUNCH_ARGUMENT}, "GT017") == [
        ("pretrain.py", 15)
    ]


def test_a_spawn_index_that_makes_a_one_machine_group(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _SPAWN}, "GT017") == []


_SCRIPT = "CUDA_VISIBLE_DEVICES=0,1 accelerate launch {flags} \\\\\n    train.py --lr 1e-4\n"


@pytest.mark.parametrize("flags", ["--multi_gpu --num_processes=2", "--num_processes=2"])
def test_save_state_under_a_multi_gpu_launch(tmp_path: Path, flags: str) -> None:
    """``--num_processes=2`` alone, in a repository that ships no config and names no
    sharding library: Accelerate's default launch on several GPUs, DDP (issue 33, set 17)."""
    script = _SCRIPT.format(flags=flags)
    files = {"train.py": _ACCELERATE, "scripts/train.sh": script}
    assert repo_findings(tmp_path, files, "GT009") == []


@pytest.mark.parametrize(
    "flags",
    [
        "--use_deepspeed --num_processes=2",
        "--use_fsdp --num_processes 2",
        "--config_file configs/zero2.yaml",
    ],
)
def test_save_state_under_a_sharded_or_unknown_launch(tmp_path: Path, flags: str) -> None:
    files = {"train.py": _ACCELERATE, "run.sh": _SCRIPT.format(flags=flags)}
    assert repo_findings(tmp_path, files, "GT009") == [("train.py", 11)]


_CURRENT_DEVICE = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = DDP(torch.nn.Linear(2, 2).cuda())
if torch.cuda.current_device() == 0:
    torch.save(model.module.state_dict(), "model.pt")
dist.destroy_process_group()
"""


@pytest.mark.parametrize(("code", "expected"), [("GT017", [("train.py", 11)]), ("GT007", [])])
def test_the_current_device_is_the_local_rank(
    tmp_path: Path, code: str, expected: list[tuple[str, int]]
) -> None:
    # set 22: `if torch.cuda.current_device() == 0:` guards the final save (the device the
    # process was pinned to is its index within the node): one writer per node, not every rank
    assert repo_findings(tmp_path, {"train.py": _CURRENT_DEVICE}, code) == expected
