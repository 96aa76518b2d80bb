"""``gpu-training lint``: a repository whose launchers all start one process per node (``GT002``).

When every launch command of a repository's shell scripts asks for one process per machine
(``torchrun --nproc_per_node=1 --nnodes=2``, ``deepspeed --num_gpus 1 --num_nodes 2``), each
rank is alone on its node and a fixed ``cuda:0`` is that rank's own GPU, not one GPU every
rank shares. Minimal reproduction written here (issue 33, set 17: a DeepSpeed-launched
send/recv demo whose ranks 0 and 1 each put a tensor on ``cuda:0``, in a repository of
two-node, one-GPU-per-node launchers), and variants with other launchers and frameworks. A
repository with one multi-GPU launch, or with no launch script at all, keeps the finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_SEND_RECV = """\
import os
import torch
import torch.distributed as dist


def exchange(rank):
    if rank == 0:
        payload = torch.ones(4, device="cuda:0")
        dist.send(payload, dst=1)
    elif rank == 1:
        inbox = torch.empty(4, device="cuda:0")
        dist.recv(inbox, src=0)


if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    dist.init_process_group("nccl", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    exchange(rank)
"""

_DDP = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("nccl")
net = DistributedDataParallel(torch.nn.Linear(8, 2).to("cuda:0"), device_ids=[0])
net(torch.randn(4, 8, device="cuda:0")).sum().backward()
"""

_FSDP = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

dist.init_process_group(backend="nccl")
device = torch.device("cuda:0")
sharded = FSDP(torch.nn.Linear(8, 2).to(device))
sharded(torch.randn(4, 8).to(device)).sum().backward()
"""


def _gt002(tmp_path: Path, script: str, launch: str | None) -> list[int]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(script)
    if launch is not None:
        (tmp_path / "run.sh").write_text(f"#!/bin/bash\n{launch}\n")
    return sorted(f.line for f in lint_paths([tmp_path]).findings if f.code == "GT002")


_ONE_PER_NODE = [
    "deepspeed --num_gpus 1 --num_nodes 2 --hostfile hosts --node_rank=$NODE train.py --deepspeed",
    "torchrun --nproc_per_node=1 --nnodes=2 --node_rank=0 \\\n  --rdzv_endpoint=$HEAD:29500 train.py",
    "python -m torch.distributed.launch --nproc-per-node 1 --nnodes 4 train.py --lr 1e-3",
]


@pytest.mark.parametrize("launch", _ONE_PER_NODE)
def test_a_fixed_gpu_under_one_process_per_node_launches(tmp_path: Path, launch: str) -> None:
    assert _gt002(tmp_path, _SEND_RECV, launch) == []


@pytest.mark.parametrize("script", [_DDP, _FSDP])
def test_other_frameworks_under_one_process_per_node(tmp_path: Path, script: str) -> None:
    assert _gt002(tmp_path, script, _ONE_PER_NODE[1]) == []


def test_a_multi_gpu_launch_keeps_the_finding(tmp_path: Path) -> None:
    launch = _ONE_PER_NODE[0] + "\ntorchrun --nproc_per_node 8 other.py"
    assert _gt002(tmp_path, _SEND_RECV, launch) != []


def test_no_launch_script_keeps_the_finding(tmp_path: Path) -> None:
    assert _gt002(tmp_path, _SEND_RECV, None) == [8, 11]


def test_a_script_that_is_not_a_launcher_says_nothing(tmp_path: Path) -> None:
    assert _gt002(tmp_path, _SEND_RECV, "python train.py --nproc_per_node 1") == [8, 11]


def test_a_multi_gpu_launch_of_a_script_given_by_a_variable(tmp_path: Path) -> None:
    """``torchrun --nproc_per_node=${2:-4} ${1:-example.py}`` launches several processes per
    node, whichever script it is handed: the repository is not one process per node."""
    launch = _ONE_PER_NODE[1] + "\ntorchrun --nnodes=1 --nproc_per_node=${2:-4} ${1:-example.py}"
    assert _gt002(tmp_path, _SEND_RECV, launch) == [8, 11]
