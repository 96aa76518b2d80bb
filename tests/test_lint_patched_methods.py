"""``gpu-training lint``: a function stored over an object's method runs where it is called.

``trainer._save_checkpoint = save_with_lora`` replaces a method of the project's trainer class;
the new function runs where the trainer calls ``self._save_checkpoint()`` (under its own
rank-0 test), not where the assignment stands, so its write is rank 0's when every call of the
method is (issue 33, set 17: a LoRA script wraps its trainer's checkpoint save). Minimal
reproductions written here, with variants (Accelerate, Fabric, a trainer of the same file);
the method called on every rank, or an attribute no method is named after, still reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_TRAINERS = {
    "ddp": (
        "import torch\nimport torch.distributed as dist\n",
        "dist.get_rank() == 0",
    ),
    "accelerate": ("import torch\n", "self.accelerator.is_main_process"),
    "fabric": ("import torch\n", "self.fabric.global_rank == 0"),
}

_TRAINER = """\
{imports}

class Trainer:
    def __init__(self, model, accelerator=None, fabric=None):
        self.model = model
        self.accelerator = accelerator
        self.fabric = fabric

    def {method}(self):
        torch.save(self.model.state_dict(), "ckpt.pt")

    def _evaluate(self):
        if {guard}:
            self.{method}()

    def train(self, steps):
        for step in range(steps):
            if step % 100 == 0:
                self._evaluate()
        {final}
"""

_SCRIPT = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import Trainer


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[local_rank])
    trainer = Trainer(model)
    original = trainer.{method}

    def with_adapter():
        original()
        torch.save({{"adapter": 1}}, os.path.join("out", "adapter.pt"))

    trainer.{attr} = with_adapter
    trainer.train(1000)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

_WRITE_LINE = 20  # torch.save in with_adapter


def _gt007(tmp_path: Path, kind: str, method: str, attr: str, final: str = "pass") -> set[int]:
    imports, guard = _TRAINERS[kind]
    (tmp_path / ".git").mkdir()
    trainer = _TRAINER.format(imports=imports, guard=guard, method=method, final=final)
    (tmp_path / "trainer.py").write_text(trainer)
    (tmp_path / "train.py").write_text(_SCRIPT.format(method=method, attr=attr))
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {f.line for f in report.findings if f.code == "GT007" and f.path.endswith("train.py")}


@pytest.mark.parametrize("kind", sorted(_TRAINERS))
@pytest.mark.parametrize("method", ["_save_checkpoint", "save_model"])
def test_a_replacement_of_a_method_called_on_rank0_writes_once(
    tmp_path: Path, kind: str, method: str
) -> None:
    assert _gt007(tmp_path, kind, method, method) == set()


def test_a_replacement_of_a_method_called_on_every_rank_reports(tmp_path: Path) -> None:
    found = _gt007(
        tmp_path, "ddp", "_save_checkpoint", "_save_checkpoint", "self._save_checkpoint()"
    )
    assert found == {_WRITE_LINE}


def test_a_function_stored_under_no_method_name_is_a_callback_of_every_rank(
    tmp_path: Path,
) -> None:
    assert _gt007(tmp_path, "ddp", "_save_checkpoint", "on_train_end") == {_WRITE_LINE}


def test_a_replacement_in_the_same_file(tmp_path: Path) -> None:
    source = _TRAINER.format(
        imports=_TRAINERS["ddp"][0], guard="dist.get_rank() == 0", method="save", final="pass"
    ) + (
        "\n\ndef main():\n"
        "    dist.init_process_group('nccl')\n"
        "    trainer = Trainer(torch.nn.Linear(2, 2))\n"
        "    keep = trainer.save\n\n"
        "    def save_more():\n"
        "        keep()\n"
        "        torch.save({'extra': 1}, 'extra.pt')\n\n"
        "    trainer.save = save_more\n"
        "    trainer.train(10)\n"
    )
    (tmp_path / "run.py").write_text(source)
    report = lint_paths([tmp_path / "run.py"])
    assert [f for f in report.findings if f.code == "GT007"] == []
