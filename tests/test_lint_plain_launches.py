"""``gpu-training lint``: a script the repository only runs as ``python script.py``.

An Accelerate script writes its checkpoint with no main-process guard; under ``accelerate
launch`` that is every rank's write (``GT007``). But when the only launch the repository ships
or documents is ``python train_grpo.py`` (its run script, its README), the ``Accelerator``
runs alone and the write has one writer: no finding, nor in a helper module that only such a
script calls. Minimal reproductions written here (issue 33, held-back set 25: a GRPO trainer
whose one run script starts it with ``python``; the false findings of sets 19 and 22 on
scripts documented only as ``python problem.py``). A launcher of several processes anywhere
(README, shell script, a Python driver, ``python -m torch.distributed.launch``), a launcher in
a shell variable, a rank on the command line, ``srun``, a script that spawns its own
processes, or no launch at all keeps the finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.cli import main
from gpu_training.diagnostics.lint.report import lint_paths
from lint_repo import repo_findings, write_repo

_TRAIN = """\
import json

import torch
from accelerate import Accelerator

from helpers import save_config

accelerator = Accelerator()
model = torch.nn.Linear(8, 8)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, opt = accelerator.prepare(model, opt)
save_config({"lr": 1e-4})
for batch in [torch.randn(2, 8)] * 4:
    accelerator.backward(model(batch).sum())
    opt.step()
    opt.zero_grad()
torch.save(accelerator.unwrap_model(model).state_dict(), "grpo.pt")
"""

_HELPERS = """\
import json

import torch.distributed as dist


def save_config(cfg):
    with open("config.json", "w") as f:
        json.dump(cfg, f)


def world():
    return dist.get_world_size() if dist.is_initialized() else 1
"""

_EVERY_RANK = [("helpers.py", 7), ("train_grpo.py", 12), ("train_grpo.py", 17)]
_RUN = "#!/bin/bash\nCUDA_VISIBLE_DEVICES=0 nohup python -u train_grpo.py \\\n  --lr 1e-4 > log &\n"


def _findings(
    tmp_path: Path, extra: dict[str, str], train: str = _TRAIN, helpers: str = _HELPERS
) -> list[tuple[str, int]]:
    files = {"train_grpo.py": train, "helpers.py": helpers, **extra}
    return repo_findings(tmp_path, files, "GT007")


@pytest.mark.parametrize(
    "launches",
    [
        {"scripts/run_grpo.sh": _RUN},
        {"README.md": "## Train\n\n```bash\npython train_grpo.py --lr 1e-4\n```\n"},
        {"scripts/run_grpo.sh": "cd .. && python -m train_grpo --lr 1e-4\n"},
    ],
    ids=["run_script", "readme", "module"],
)
def test_a_script_only_run_as_python_has_one_writer(
    tmp_path: Path, launches: dict[str, str]
) -> None:
    assert _findings(tmp_path, launches) == []


@pytest.mark.parametrize(
    "launches",
    [
        {"scripts/run_grpo.sh": _RUN, "README.md": "accelerate launch train_grpo.py\n"},
        {"scripts/run_grpo.sh": "$LAUNCHER train_grpo.py --lr 1e-4\n"},
        {"scripts/run_grpo.sh": "srun python train_grpo.py --lr 1e-4\n"},
        {"scripts/run_grpo.sh": "RANK=1 WORLD_SIZE=2 python train_grpo.py &\n"},
        {
            "scripts/run_grpo.sh": _RUN,
            "README.md": "python -m torch.distributed.launch --nproc_per_node 2 train_grpo.py\n",
        },
        {
            "scripts/run_grpo.sh": _RUN,
            "submit.py": 'cmd = f"torchrun --nproc_per_node {n} train_grpo.py"\n',
        },
        {
            "scripts/run_grpo.sh": _RUN,
            "scripts/slurm.sh": 'ARGS=(train_grpo.py --lr 1)\ntorchrun --nproc_per_node=4 "${ARGS[@]}"\n',
        },
        {"scripts/run_grpo.sh": _RUN + "# torchrun --nproc_per_node 2 train_grpo.py\n"},
        {
            "scripts/run_grpo.sh": _RUN,
            "scripts/launch.sh": 'torchrun --nproc_per_node=4 "$SCRIPT"\n',
        },
        {},
    ],
    ids=[
        "readme_launcher",
        "launcher_variable",
        "srun",
        "rank_on_the_line",
        "python_m_launcher",
        "python_driver",
        "launcher_of_an_array",
        "commented_out_launcher",
        "launcher_of_a_variable_alone",
        "no_launch",
    ],
)
def test_a_launch_of_several_processes_keeps_the_findings(
    tmp_path: Path, launches: dict[str, str]
) -> None:
    assert _findings(tmp_path, launches) == _EVERY_RANK


def test_a_script_that_spawns_its_ranks_keeps_the_findings(tmp_path: Path) -> None:
    train = _TRAIN.replace(
        "from accelerate import Accelerator\n",
        "from accelerate import Accelerator, notebook_launcher\n",
    )
    found = _findings(tmp_path, {"scripts/run_grpo.sh": _RUN}, train)
    assert found == _EVERY_RANK


def test_a_script_whose_modules_launch_processes_keeps_the_findings(tmp_path: Path) -> None:
    helpers = "import submitit  # the jobs run as SLURM tasks\n" + _HELPERS
    found = _findings(tmp_path, {"scripts/run_grpo.sh": _RUN}, helpers=helpers)
    assert found == [("helpers.py", 8), ("train_grpo.py", 12), ("train_grpo.py", 17)]


def test_unshipped_reports_what_only_another_launch_would_run(tmp_path: Path) -> None:
    files = {"train_grpo.py": _TRAIN, "helpers.py": _HELPERS, "scripts/run_grpo.sh": _RUN}
    found = lint_paths([write_repo(tmp_path, files)], unshipped=True).findings
    assert sorted((Path(f.path).name, f.line) for f in found if f.code == "GT007") == _EVERY_RANK


def test_the_command_line_takes_unshipped(tmp_path: Path) -> None:
    files = {"train_grpo.py": _TRAIN, "helpers.py": _HELPERS, "scripts/run_grpo.sh": _RUN}
    root = str(write_repo(tmp_path, files))
    assert main(["lint", "--select", "GT007", root]) == 0
    assert main(["lint", "--select", "GT007", "--unshipped", root]) == 1
