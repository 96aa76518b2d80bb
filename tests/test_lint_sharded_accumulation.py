"""``gpu-training lint`` ``GT013``: accumulation in a function that trains its own FSDP model.

A module trains an FSDP model it wraps itself (``FSDP(model)``, ``fully_shard(model)``, or a
helper of the same module that does) with hand-rolled gradient accumulation; a DDP script of
the same project imports its helpers. The DDP wrapper the importer makes never reaches the
FSDP function: its backward reduce-scatters by design, there is no DDP all-reduce for
``no_sync()`` to skip. The DDP script's own accumulation is still ``GT013``. Minimal
reproductions written here (issue 33, set 14: an FSDP trainer beside a DDP copy).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_LOOP = """\
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
"""

_SHARDED = {
    "fsdp1_helper": (
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\n\n"
        "def wrap(model):\n    return FSDP(model, use_orig_params=True)\n\n\n"
        "def train(model, loader, accum):\n    model = wrap(model.cuda())\n"
    ),
    "fsdp1_inline": (
        "from torch.distributed.fsdp import FullyShardedDataParallel\n\n\n"
        "def train(model, loader, accum):\n    model = FullyShardedDataParallel(model.cuda())\n"
    ),
    "fsdp2": (
        "from torch.distributed.fsdp import fully_shard\n\n\n"
        "def train(model, loader, accum):\n"
        "    for block in model.layers:\n        fully_shard(block)\n    fully_shard(model)\n"
    ),
}

_COMMON = """\
import torch
import torch.distributed as dist


def reduce_mean(value):
    dist.all_reduce(value)
    return value / dist.get_world_size()


"""

_DDP = (
    """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import reduce_mean


def train(model, loader, accum):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(model.cuda(), device_ids=[local_rank])
"""
    + _LOOP
    + "    dist.destroy_process_group()\n"
    + "\n\nif __name__ == '__main__':\n    train(build_model(), build_loader(), accum=4)\n"
)  # a script of its own: a module nothing imports nor runs is not read (orphan_modules)


_RUN = """\
import torch.distributed as dist

from trainer import train

if __name__ == "__main__":
    dist.init_process_group("nccl")
    train(build_model(), build_loader(), accum=4)
    dist.destroy_process_group()
"""


def _findings(tmp_path: Path, sharded: str) -> set[tuple[str, str]]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "trainer.py").write_text(_COMMON + _SHARDED[sharded] + _LOOP)
    (tmp_path / "ddp_train.py").write_text(_DDP)
    (tmp_path / "run_fsdp.py").write_text(_RUN)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {(Path(f.path).name, f.code) for f in report.findings}


@pytest.mark.parametrize("sharded", sorted(_SHARDED))
def test_accumulation_on_an_own_fsdp_model_is_not_gt013(tmp_path: Path, sharded: str) -> None:
    found = _findings(tmp_path, sharded)
    assert ("trainer.py", "GT013") not in found
    assert ("ddp_train.py", "GT013") in found  # the DDP copy's accumulation still all-reduces


def test_a_function_that_also_makes_a_ddp_wrapper_keeps_gt013(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    source = _COMMON + _SHARDED["fsdp1_inline"].replace(
        "    model = FullyShardedDataParallel(model.cuda())\n",
        "    model = FullyShardedDataParallel(model.cuda()) if accum < 0 else "
        "torch.nn.parallel.DistributedDataParallel(model.cuda())\n",
    )
    (tmp_path / "trainer.py").write_text(source + _LOOP)
    (tmp_path / "run_fsdp.py").write_text(_RUN)
    report = lint_paths([tmp_path])
    assert "GT013" in {f.code for f in report.findings}
