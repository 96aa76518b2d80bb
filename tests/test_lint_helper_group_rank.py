"""``gpu-training lint`` ``GT017``: a spawn index that a helper makes the group's rank is global.

Issue 33, the random samples of findings over 111 DDP repositories
(``benchmarks/lint_ddpsample_triage.csv`` and ``lint_ddpsample2_triage.csv``): a road-sign
classifier spawns one worker per GPU, and each calls ``init_process(rank, size)`` from
``utils/utils_dist.py``, which runs ``dist.init_process_group(backend, rank=rank,
world_size=size)``. The worker's ``if rank == 0:`` save is then one process of the whole job,
not local rank 0 of every node (the reader: false twice, ``guarded``). A group created with
the spawn index in the worker's own file was already read so; through a helper it was not.
A helper that leaves the rank to the environment keeps the spawn index node-local.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_TRAIN = """\
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from utils.dist_utils import init_process


def worker(rank, world_size):
    init_process(CALL)
    model = torch.nn.Linear(2, 2)
    if rank == 0:
        torch.save(model.state_dict(), "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(4,), nprocs=4)
"""

_UTILS = """\
import os

import torch.distributed as dist


def init_process(rank, size, backend="gloo", master_addr="127.0.0.1"):
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group(backend, rank=RANK, world_size=size)
"""


@pytest.mark.parametrize(
    ("call", "rank", "found"),
    [
        ("rank, world_size", "rank", []),
        ("rank=rank, size=world_size", "rank", []),
        ("rank, world_size", "int(rank)", []),
        ("rank, world_size", "int(os.environ['RANK'])", [("train.py", 12)]),
    ],
)
def test_the_rank_a_helper_makes_the_group_with(
    tmp_path: Path, call: str, rank: str, found: list
) -> None:
    files = {
        "train.py": _TRAIN.replace("CALL", call),
        "utils/dist_utils.py": _UTILS.replace("RANK", rank),
    }
    assert repo_findings(tmp_path, files, "GT017") == found


_ENV_UTILS = """\
import os

import torch.distributed as dist


def init_process(rank, size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    os.environ["WORLD_SIZE"] = str(size)
    os.environ["KEY"] = str(rank)
    dist.init_process_group("gloo", init_method="env://")
"""


@pytest.mark.parametrize(("key", "found"), [("RANK", []), ("LOCAL_RANK", [("train.py", 12)])])
def test_the_rank_a_helper_puts_in_the_environment(tmp_path: Path, key: str, found: list) -> None:
    """The fourth sample's ``gbbin/DDP-practice``: ``init_ddp(local_rank)`` sets
    ``os.environ["RANK"] = str(local_rank)`` and creates an ``env://`` group, so the spawn
    index is the group's rank (the reader: false, ``guarded``); ``LOCAL_RANK`` would not be."""
    files = {
        "train.py": _TRAIN.replace("CALL", "rank, world_size"),
        "utils/dist_utils.py": _ENV_UTILS.replace("KEY", key),
    }
    assert repo_findings(tmp_path, files, "GT017") == found


def test_the_rank_a_worker_puts_in_the_environment(tmp_path: Path) -> None:
    script = _TRAIN.replace("from utils.dist_utils import init_process\n", "import os\n").replace(
        "    init_process(CALL)\n",
        '    os.environ["RANK"] = str(rank)\n    dist.init_process_group("gloo")\n',
    )
    assert repo_findings(tmp_path, {"train.py": script}, "GT017") == []
