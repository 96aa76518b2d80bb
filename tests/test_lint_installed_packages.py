"""``gpu-training lint`` leaves out the libraries a repository installs into itself.

Issue 33, the second random sample of findings over 111 DDP repositories
(``benchmarks/lint_ddpsample2_triage.csv``): an example repository ships the libraries its
fine-tuning script needs, installed with ``pip install --target packages/``: Accelerate,
Transformers and huggingface_hub, each beside its ``*.dist-info``. Four findings in that code
(a Trainer write, a download's move, an offload index) were the libraries', not the
repository's (the reader: false, and no defect of the code). A directory of installed
distributions is a ``site-packages`` by another name: a directory run does not search it,
its shell files are no launch of the repository's, and a file in it named on the command
line is still linted.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths
from lint_repo import write_repo

_LIBRARY = """\
import torch
import torch.distributed as dist


def save(model):
    dist.init_process_group("gloo")
    torch.save(model.state_dict(), "model.pt")
"""

_SCRIPT = "print('fine-tune')\n"


def _files(root: Path, dist_info: bool) -> Path:
    files = {"finetune.py": _SCRIPT, "packages/somelib/__init__.py": _LIBRARY}
    if dist_info:
        files["packages/somelib-1.2.0.dist-info/METADATA"] = "Name: somelib\n"
    return write_repo(root, files)


def test_installed_distributions_are_not_searched(tmp_path: Path) -> None:
    report = lint_paths([_files(tmp_path, dist_info=True)])
    assert report.files == 1
    assert report.findings == []


def test_a_package_of_the_repository_is_searched(tmp_path: Path) -> None:
    report = lint_paths([_files(tmp_path, dist_info=False)])
    assert report.files == 2
    assert [(Path(f.path).name, f.code) for f in report.findings] == [("__init__.py", "GT007")]


def test_a_file_named_in_it_is_linted(tmp_path: Path) -> None:
    root = _files(tmp_path, dist_info=True)
    report = lint_paths([root / "packages" / "somelib" / "__init__.py"])
    assert [f.code for f in report.findings] == ["GT007"]
