"""``gpu-training lint``: a local helper that runs another module's collective, under rank 0.

``if step % 100 == 0 and dist.get_rank() == 0: self.save_checkpoint()``, where
``save_checkpoint`` calls ``self.checkpointer.save(...)`` of another module, which runs
FSDP2's ``get_model_state_dict`` and ``dcp.save`` (collectives): rank 0 waits in them while
the other ranks go on to the barrier, a hang (``GT009``). The same save called on every rank
is fine. Minimal reproductions written here (issue 33, set 13), with a DCP checkpointer, an
all-reduce of metrics and a DeepSpeed engine's save_checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_HELPERS = {
    "dcp": """\
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict


class Checkpointer:
    def __init__(self, root):
        self.root = root

    def save(self, model, step):
        state = {"model": get_model_state_dict(model)}
        dcp.save(state, checkpoint_id=f"{self.root}/{step}")
""",
    "all_reduce": """\
import torch
import torch.distributed as dist


class Checkpointer:
    def __init__(self, root):
        self.root = root

    def save(self, model, step):
        loss = torch.zeros(1)
        dist.all_reduce(loss)
        torch.save(model.state_dict(), f"{self.root}/{step}.pt")
""",
    "deepspeed": """\
class Checkpointer:
    def __init__(self, root):
        self.root = root

    def save(self, engine, step):
        engine.save_checkpoint(self.root, tag=str(step))
""",
}

_TRAINER = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from ckpt import Checkpointer


class Trainer:
    def __init__(self, model):
        self.model = model
        self.checkpointer = Checkpointer("ckpts")
        self.step = 0

    def save_checkpoint(self):
        self.checkpointer.save(self.model, self.step)

    def train_step(self, batch):
        self.model(batch).sum().backward()
{save}        dist.barrier()
        self.step += 1


def main():
    dist.init_process_group("nccl")
    trainer = Trainer(fully_shard(torch.nn.Linear(2, 2)))
    trainer.train_step(torch.ones(2))
    dist.destroy_process_group()
"""

_ON_RANK0 = "        if self.step % 100 == 0 and dist.get_rank() == 0:\n            self.save_checkpoint()\n"
_EVERY_RANK = "        if self.step % 100 == 0:\n            self.save_checkpoint()\n"


def _gt009(tmp_path: Path, helper: str, save: str) -> set[int]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "ckpt.py").write_text(helper)
    (tmp_path / "train.py").write_text(_TRAINER.format(save=save))
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {f.line for f in report.findings if f.code == "GT009" and f.path.endswith("train.py")}


@pytest.mark.parametrize("case", ["dcp", "all_reduce"])
def test_a_helper_reaching_a_collective_under_rank0_is_gt009(tmp_path: Path, case: str) -> None:
    assert _gt009(tmp_path, _HELPERS[case], _ON_RANK0) == {20}


@pytest.mark.parametrize("case", sorted(_HELPERS))
def test_the_same_helper_on_every_rank_is_not_gt009(tmp_path: Path, case: str) -> None:
    assert _gt009(tmp_path, _HELPERS[case], _EVERY_RANK) == set()
