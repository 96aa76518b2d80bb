"""``gpu-training lint``: the DDP constructor is a collective (``GT009``), and a step of an
optimizer only some ranks build makes no replica diverge (no ``GT014``).

Issue 33, the sixth random sample of findings (``benchmarks/lint_ddpsample6_triage.csv``): a
tutorial's model-parallel demo runs on two ranks, and only ``if rank % 2 == 0:`` builds the
model, wraps it in ``DistributedDataParallel``, trains a step and leaves. The constructor checks
the parameters' shapes across the ranks and broadcasts rank 0's: rank 0 waits there for rank 1
for good, a hang the lint did not name, while ``GT014`` reported the even ranks' ``step()`` as a
divergence of replicas that rank 1 never had. A constructor given its own ``process_group`` (a
group of those ranks) is no such hang. Minimal reproductions written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel as DDP


def demo(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    if GUARD:
        model = DDP(nn.Linear(10, 5)WITH)
        optimizer = optim.SGD(model.parameters(), lr=0.001)
        optimizer.zero_grad()
        model(torch.randn(20, 10)).sum().backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(demo, args=(2,), nprocs=2)
"""


def _script(guard: str, with_: str = "") -> dict[str, str]:
    return {"mp.py": _SCRIPT.replace("GUARD", guard).replace("WITH", with_)}


@pytest.mark.parametrize("guard", ["rank % 2 == 0", "rank == 0"], ids=["even", "rank0"])
def test_a_ddp_constructor_on_some_ranks_only_is_a_hang(tmp_path: Path, guard: str) -> None:
    assert len(repo_findings(tmp_path, _script(guard), "GT009")) == 1
    assert repo_findings(tmp_path, _script(guard), "GT014") == []


def test_a_ddp_constructor_on_its_own_group_is_not(tmp_path: Path) -> None:
    files = _script("rank % 2 == 0", ", process_group=group")
    files["mp.py"] = files["mp.py"].replace(
        "    if rank", "    group = dist.new_group([0])\n    if rank"
    )
    assert repo_findings(tmp_path, files, "GT009") == []


def test_a_step_of_an_optimizer_every_rank_built_stays_reported(tmp_path: Path) -> None:
    """The optimizer made before the guard: every rank holds a replica, rank 0 alone steps."""
    text = _SCRIPT.replace(
        "    if GUARD:\n        model = DDP(nn.Linear(10, 5)WITH)\n"
        "        optimizer = optim.SGD(model.parameters(), lr=0.001)\n",
        "    model = DDP(nn.Linear(10, 5))\n"
        "    optimizer = optim.SGD(model.parameters(), lr=0.001)\n"
        "    if rank == 0:\n",
    )
    assert "if rank == 0:" in text
    assert len(repo_findings(tmp_path, {"mp.py": text}, "GT014")) == 1
