"""``gpu-training lint``: the ``__main__`` block of a module the distributed scripts import.

An evaluation module writes its results in functions the trainer calls on rank 0 only
(``if fabric.global_rank == 0: evaluate(...)``), and runs the same functions from its own
``if __name__ == "__main__":`` block. That block runs only when the module is started by
itself; its own code starts no group, no launcher and no framework, so it is one process,
not every rank of the trainer's launch. The functions' writes are then on rank 0 (or in a
lone process) at every call: no ``GT007``. Minimal reproductions written here (issue 33,
set 13), with the caller's rank carried by a Fabric, an Accelerator, a trainer's
``self.rank`` and ``args.rank``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_EVALUATION = """\
import argparse
import json


def evaluate(model, out_dir):
    scores = {"accuracy": 1.0}
    with open(f"{out_dir}/scores.json", "w") as f:
        json.dump(scores, f)
    return scores


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    evaluate(None, args.out)
"""

_TRAINERS = {
    "fabric": """\
import lightning as L

from evaluation import evaluate


def main(model):
    fabric = L.Fabric(strategy="ddp", devices=2)
    fabric.launch()
    model = fabric.setup(model)
    if fabric.global_rank == 0:
        evaluate(model, "out")
    fabric.barrier()
""",
    "accelerate": """\
from accelerate import Accelerator

import evaluation


def main(model):
    accelerator = Accelerator()
    model = accelerator.prepare(model)
    if accelerator.is_main_process:
        evaluation.evaluate(model, "out")
    accelerator.wait_for_everyone()
""",
    "trainer_rank": """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from evaluation import evaluate


class Trainer:
    def __init__(self, model):
        dist.init_process_group("nccl")
        self.rank = dist.get_rank()
        self.model = DDP(model)

    def validate(self):
        if self.rank == 0:
            evaluate(self.model.module, "out")
        dist.barrier()
""",
    "args_rank": """\
import torch.distributed as dist

from evaluation import evaluate


def main(args, model):
    dist.init_process_group("nccl", rank=args.rank, world_size=args.world_size)
    if args.rank == 0:
        evaluate(model, "out")
    dist.barrier()
""",
}


def _gt007(tmp_path: Path, trainer: str, evaluation: str = _EVALUATION) -> set[tuple[str, int]]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "evaluation.py").write_text(evaluation)
    (tmp_path / "train.py").write_text(trainer)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {(Path(f.path).name, f.line) for f in report.findings if f.code == "GT007"}


@pytest.mark.parametrize("case", sorted(_TRAINERS))
def test_a_helper_run_by_its_own_main_block_and_by_rank0_writes_once(
    tmp_path: Path, case: str
) -> None:
    assert _gt007(tmp_path, _TRAINERS[case]) == set()


def test_the_helper_called_on_every_rank_is_still_gt007(tmp_path: Path) -> None:
    trainer = _TRAINERS["args_rank"].replace(
        "    if args.rank == 0:\n        evaluate", "    evaluate"
    )
    assert ("evaluation.py", 7) in _gt007(tmp_path, trainer)


def test_a_main_block_that_starts_the_group_itself_runs_on_every_rank(tmp_path: Path) -> None:
    evaluation = _EVALUATION.replace(
        "    evaluate(None, args.out)\n",
        "    import torch.distributed as dist\n\n    dist.init_process_group('nccl')\n"
        "    evaluate(None, args.out)\n",
    )
    assert ("evaluation.py", 7) in _gt007(tmp_path, _TRAINERS["fabric"], evaluation)
