"""``gpu-training lint`` ``GT002``: a device handed only to parameters nothing reads.

Issue 33, the third random sample of findings (``benchmarks/lint_ddpsample3_triage.csv``): a
spawned DDP worker builds ``device = torch.device("cuda" if use_cuda else "cpu")`` and passes
it to ``test(model, device, loader, rank)``, whose body never reads ``device``: every tensor
goes ``.to(rank)``. ``GT002`` ("every rank lands on cuda:0") was reported at the ``"cuda"``.
A device whose every read is an argument to a parameter of the file's own functions that
their bodies never read places nothing, like a device no line reads; one a callee does read
(``data.to(device)``) is still reported. Minimal reproductions written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def test(model, device, loader, rank):
    for data, target in loader:
        data = data.to(USE)
        model(data)


def worker(rank, world_size, use_cuda):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    device = torch.device("cuda" if use_cuda else "cpu")
    model = DDP(torch.nn.Linear(2, 2).to(rank), device_ids=[rank])
    test(model, device, [], rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, True), nprocs=2)
"""


def test_a_device_only_handed_to_an_unread_parameter_is_not_reported(tmp_path: Path) -> None:
    files = {"mnist_ddp.py": _SCRIPT.replace("USE", "rank")}
    assert repo_findings(tmp_path, files, "GT002") == []


@pytest.mark.parametrize("use", ["device"], ids=["read"])
def test_a_device_a_callee_reads_stays_reported(tmp_path: Path, use: str) -> None:
    files = {"mnist_ddp.py": _SCRIPT.replace("USE", use)}
    assert len(repo_findings(tmp_path, files, "GT002")) == 1
