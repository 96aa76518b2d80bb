"""``gpu-training lint``: a script's function that only another script's same name calls never runs.

Issue 33, the second random sample of findings over 111 DDP repositories
(``benchmarks/lint_ddpsample2_triage.csv``): a course repository's ``train_dist.py`` keeps a
``load_data()`` with unsharded loaders that its ``run()`` no longer calls (it uses
``partition_dataset()``), while ``train_cifar.py`` beside it defines and calls a
``load_data()`` of its own. Reachability by name let that other script's call keep the dead
function alive (the reader: false, ``unreached``). A script nothing imports is named only by
its own code; a module another file imports, or one a string names (``import_module``),
stays named by everyone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_DIST = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def load_data():
    data = list(range(64))
    return DataLoader(data, batch_size=8, shuffle=True)


def partition_dataset():
    data = list(range(64))
    return DataLoader(data, batch_size=8, sampler=DistributedSampler(data))


def run():
    dist.init_process_group("gloo")
    for batch in partition_dataset():
        print(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    run()
"""

_OTHER = """\
from torch.utils.data import DataLoader


def load_data():
    return DataLoader(list(range(8)), batch_size=2)


if __name__ == "__main__":
    print(len(load_data()))
"""


def test_another_scripts_same_name_does_not_call_it(tmp_path: Path) -> None:
    files = {"train_dist.py": _DIST, "train_single.py": _OTHER}
    assert repo_findings(tmp_path, files, "GT003") == []


@pytest.mark.parametrize(
    "reach",
    [
        "import train_dist\n",
        "import importlib\ntrain_dist = importlib.import_module('train_dist')\n",
    ],
)
def test_a_module_another_file_imports_or_a_string_names_is_named_by_it(
    tmp_path: Path, reach: str
) -> None:
    user = (
        f"import torch.distributed as dist\n{reach}\nif __name__ == '__main__':\n"
        "    dist.init_process_group('gloo')\n    train_dist.load_data()\n"
        "    dist.destroy_process_group()\n"
    )
    files = {"train_dist.py": _DIST, "train_single.py": _OTHER, "use.py": user}
    assert ("train_dist.py", 8) in repo_findings(tmp_path, files, "GT003")


def test_its_own_call_keeps_it_reported(tmp_path: Path) -> None:
    script = _DIST.replace("for batch in partition_dataset():", "for batch in load_data():")
    files = {"train_dist.py": script, "train_single.py": _OTHER}
    assert repo_findings(tmp_path, files, "GT003") == [("train_dist.py", 8)]
