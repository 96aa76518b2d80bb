"""``gpu-training lint``: a second entry script that only borrows another script's trainer.

A small GPT project (issue 33, set 19) has ``train.py``, its trainer script, whose class joins
a process group when a launcher's ``RANK`` is set, and ``problem.py``, a toy task that writes
its data set and then runs that trainer. Nothing in ``problem.py`` reads a rank or names a
distributed package and nothing launches it under ``torchrun``: it runs as one process, so its
data-set writes have one writer (no ``GT007``). The variants borrow an Accelerate and a
DeepSpeed script's training function; the same file reading the launcher's rank, launched by
the repository's shell script, or joining the group through a helper module (not an entry
script) still reports.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths

_TRAINER = """\
import os

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


class TrainGPT:
    def __init__(self, config):
        self.config = config

    def start(self):
        self.is_ddp = int(os.environ.get("RANK", -1)) != -1
        if self.is_ddp:
            init_process_group(backend="nccl")
            self.master = int(os.environ["RANK"]) == 0
        else:
            self.master = True
        model = build(self.config)
        model = DDP(model) if self.is_ddp else model
        for batch in batches(self.config):
            model(batch).sum().backward()
        if self.master:
            torch.save(model.state_dict(), self.config["out"])
        if self.is_ddp:
            destroy_process_group()


if __name__ == "__main__":
    TrainGPT({"out": "ckpt.pt"}).start()
"""

_PROBLEM = """\
import random
{extra}
from train import TrainGPT

TRAIN_PATH = "dataset/sort_train.txt"


def generate_dataset():
    lines = [str(random.random()) for _ in range(1000)]
    with open(TRAIN_PATH, "w") as handle:
        handle.write("\\n".join(lines))


def main():
    generate_dataset()
    TrainGPT({{"out": "problem.pt", "data": TRAIN_PATH}}).start()


if __name__ == "__main__":
    main()
"""


def _repository(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / ".git").mkdir(parents=True)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def _gt007(root: Path, name: str) -> list[int]:
    report = lint_paths([root])
    assert not report.errors, report.errors
    return sorted(f.line for f in report.findings if f.code == "GT007" and f.path.endswith(name))


def test_a_toy_task_borrowing_the_trainer_script_writes_once(tmp_path: Path) -> None:
    files = {"train.py": _TRAINER, "problem.py": _PROBLEM.format(extra="")}
    assert _gt007(_repository(tmp_path, files), "problem.py") == []


def test_the_same_task_reading_the_launcher_rank_reports(tmp_path: Path) -> None:
    extra = "import os\nLOCAL_RANK = int(os.environ.get('LOCAL_RANK', 0))\n"
    files = {"train.py": _TRAINER, "problem.py": _PROBLEM.format(extra=extra)}
    assert _gt007(_repository(tmp_path, files), "problem.py") == [12]


def test_the_same_task_launched_by_a_shell_script_reports(tmp_path: Path) -> None:
    files = {
        "train.py": _TRAINER,
        "problem.py": _PROBLEM.format(extra=""),
        "run.sh": "torchrun --nproc_per_node 4 problem.py\n",
    }
    assert _gt007(_repository(tmp_path, files), "problem.py") == [10]


def test_a_group_joined_through_a_helper_module_reports(tmp_path: Path) -> None:
    helper = (
        "import torch.distributed as dist\n\n\n"
        "class TrainGPT:\n"
        "    def __init__(self, config):\n        self.config = config\n\n"
        "    def start(self):\n        dist.init_process_group('nccl')\n"
    )
    problem = _PROBLEM.format(extra="").replace("from train import", "from engine import")
    files = {"engine.py": helper, "problem.py": problem}
    assert _gt007(_repository(tmp_path, files), "problem.py") == [10]


_ACCELERATE_SCRIPT = """\
from accelerate import Accelerator


def run(config):
    accelerator = Accelerator()
    model, loader = accelerator.prepare(build(config), loader_for(config))
    for batch in loader:
        accelerator.backward(model(batch).sum())
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    run({})
"""


def test_a_demo_borrowing_an_accelerate_script_writes_once(tmp_path: Path) -> None:
    demo = (
        "import json\n\nfrom finetune import run\n\n\n"
        "def main():\n"
        "    with open('demo_config.json', 'w') as handle:\n"
        "        json.dump({'lr': 1e-4}, handle)\n"
        "    run({'lr': 1e-4})\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    files = {"finetune.py": _ACCELERATE_SCRIPT, "demo.py": demo}
    assert _gt007(_repository(tmp_path, files), "demo.py") == []
    aware = demo.replace("    run(", "    print(os.environ['RANK'])\n    run(").replace(
        "import json", "import json\nimport os"
    )
    files["demo.py"] = aware
    assert _gt007(_repository(tmp_path / "again", files), "demo.py") == [8]


def test_a_demo_borrowing_a_deepspeed_script(tmp_path: Path) -> None:
    script = (
        "import deepspeed\n\n\n"
        "def fit(model, params):\n"
        "    deepspeed.init_distributed()\n"
        "    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params)\n"
        "    return engine\n\n\n"
        "if __name__ == '__main__':\n    fit(None, [])\n"
    )
    demo = (
        "import torch\n\nfrom ds_train import fit\n\n\n"
        "def main():\n"
        "    engine = fit(torch.nn.Linear(2, 2), [])\n"
        "    torch.save(engine.module.state_dict(), 'demo.pt')\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    files = {"ds_train.py": script, "demo.py": demo}
    assert _gt007(_repository(tmp_path, files), "demo.py") == []
