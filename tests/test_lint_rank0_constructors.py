"""``gpu-training lint``: a class whose every construction is under a rank-0 guard.

A logger that writes its header in ``__init__`` runs that write where the class is called:
``if is_main_process(): logger = CSVLogger(...)`` writes once. Its ``__init__`` starts in the
context of its class's calls, like any function of the project at its call sites; the
other special methods (``__call__``, ``__getitem__``) run where Python calls them and keep
the default context. Minimal reproductions written here (issue 33, set 13), with DDP,
Accelerate and Lightning Fabric guards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_HELPERS = """\
import csv
import json


class MetricsCSV:
    def __init__(self, path, fields):
        self.path = path
        with open(path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writeheader()


class RunRecord:
    def __init__(self, directory, config):
        with open(f"{directory}/config.json", "w") as f:
            json.dump(config, f)
"""

_SCRIPTS = {
    "ddp": """\
import torch.distributed as dist

from helpers import MetricsCSV


def main():
    dist.init_process_group("nccl")
    log = None
    if dist.get_rank() == 0:
        log = MetricsCSV("metrics.csv", ["step", "loss"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
""",
    "accelerate": """\
from accelerate import Accelerator

from helpers import RunRecord


def main(config):
    accelerator = Accelerator()
    if accelerator.is_main_process:
        RunRecord("out", config)


if __name__ == "__main__":
    main({"lr": 0.1})
""",
    "fabric": """\
import lightning as L

import helpers


def main(config):
    fabric = L.Fabric(strategy="ddp", devices=2)
    fabric.launch()
    record = helpers.RunRecord("out", config) if fabric.global_rank == 0 else None
    return record


if __name__ == "__main__":
    main({"lr": 0.1})
""",
}


def _gt007(tmp_path: Path, script: str) -> set[tuple[str, int]]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "helpers.py").write_text(_HELPERS)
    (tmp_path / "train.py").write_text(script)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {(Path(f.path).name, f.line) for f in report.findings if f.code == "GT007"}


@pytest.mark.parametrize("case", sorted(_SCRIPTS))
def test_a_class_made_on_rank0_only_writes_once(tmp_path: Path, case: str) -> None:
    assert _gt007(tmp_path, _SCRIPTS[case]) == set()


def test_a_class_made_on_every_rank_writes_on_every_rank(tmp_path: Path) -> None:
    script = _SCRIPTS["ddp"].replace(
        "    if dist.get_rank() == 0:\n        log = MetricsCSV", "    log = MetricsCSV"
    )
    assert ("helpers.py", 8) in _gt007(tmp_path, script)
