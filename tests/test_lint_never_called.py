"""``gpu-training lint``: calls inside functions nothing calls set no callee's context.

A record class saves its file in ``save()``, which ``update()`` calls; every live caller
runs ``update()`` under a rank-0 guard, but a legacy wrapper nobody calls (a module-level
function, or a method of a plain class named nowhere) calls it too. That wrapper never
runs: ``save()`` runs on rank 0 only, no ``GT007``. Once something calls the wrapper on
every rank (by its name, or by ``getattr`` with its name), the write is every rank's again.
Minimal reproductions written here (issue 33, set 13), with DDP and Accelerate guards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_RECORD = """\
import json


class RunRecord:
    def __init__(self, path):
        self.path = path
        self.data = {}

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self.data, f)

    def update(self, key, value):
        self.data[key] = value
        self.save()

    def bump_round(self):
        self.update("round", self.data.get("round", 0) + 1)


def write_legacy(path, data):
    record = RunRecord(path)
    record.data = data
    record.save()
"""

_TRAINERS = {
    "ddp": """\
import torch.distributed as dist

from record import RunRecord


def main():
    dist.init_process_group("nccl")
    record = RunRecord("run.json")
    if dist.get_rank() == 0:
        record.update("status", "training")
    dist.barrier()
{extra}""",
    "accelerate": """\
from accelerate import Accelerator

from record import RunRecord


def main():
    accelerator = Accelerator()
    record = RunRecord("run.json")
    if accelerator.is_main_process:
        record.update("status", "training")
    accelerator.wait_for_everyone()
{extra}""",
}


def _gt007(tmp_path: Path, trainer: str) -> set[tuple[str, int]]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "record.py").write_text(_RECORD)
    (tmp_path / "train.py").write_text(trainer)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {(Path(f.path).name, f.line) for f in report.findings if f.code == "GT007"}


@pytest.mark.parametrize("case", sorted(_TRAINERS))
def test_a_write_reached_on_rank0_and_from_dead_wrappers_is_rank0(
    tmp_path: Path, case: str
) -> None:
    assert _gt007(tmp_path, _TRAINERS[case].format(extra="")) == set()


@pytest.mark.parametrize(
    "extra",
    [
        "    record.bump_round()\n",
        "    getattr(record, 'bump_round')()\n",
    ],
)
def test_a_wrapper_called_on_every_rank_writes_on_every_rank(tmp_path: Path, extra: str) -> None:
    assert ("record.py", 10) in _gt007(tmp_path, _TRAINERS["ddp"].format(extra=extra))


def test_a_module_function_called_on_every_rank_writes_on_every_rank(tmp_path: Path) -> None:
    trainer = (
        _TRAINERS["ddp"]
        .format(extra="")
        .replace("from record import RunRecord", "from record import RunRecord, write_legacy")
    )
    trainer += "    write_legacy('run.json', {})\n"
    assert ("record.py", 10) in _gt007(tmp_path, trainer)
