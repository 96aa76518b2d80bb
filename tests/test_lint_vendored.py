"""``gpu-training lint``: a copy of a library the repository depends on is not its code.

A research repository that carries a patched ``transformers/`` (its ``__init__.py`` sets
``__version__``, its ``requirements.txt`` pins ``transformers==4.36.1``) holds the library's
trainer, whose writes sit behind the library's own checks and run only where the project
builds that trainer. A directory run skips the copy and resolves ``import transformers`` as
the library, as it does for installed packages. Minimal reproductions written here (issue 33,
set 26: a remote-sensing VLM repository with a vendored transformers tree, 25 false ``GT007``).
A package of the project's own that sets ``__version__``, or a copy of a library the
repository does not declare (the library's own repository), is linted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.discover import python_files
from gpu_training.diagnostics.lint.report import lint_paths
from lint_repo import write_repo

_LIBRARY_TRAINER = """\
import torch
import torch.distributed as dist


class Trainer:
    def save(self, path):
        torch.save({"step": 1}, path)


def run():
    dist.init_process_group("nccl")
    Trainer().save("state.pt")
"""

_TRAIN = """\
import torch.distributed as dist

from transformers import AutoModel

dist.init_process_group("nccl")
model = AutoModel.from_pretrained("x")
dist.destroy_process_group()
"""


def _files(requirements: str) -> dict[str, str]:
    return {
        "requirements.txt": requirements,
        "transformers/__init__.py": '__version__ = "4.36.1"\nfrom .trainer import Trainer\n',
        "transformers/trainer.py": _LIBRARY_TRAINER,
        "train.py": _TRAIN,
    }


@pytest.mark.parametrize("requirements", ["torch\ntransformers==4.36.1\n", "transformers>=4.30\n"])
def test_a_vendored_copy_of_a_dependency_is_not_linted(tmp_path: Path, requirements: str) -> None:
    root = write_repo(tmp_path, _files(requirements))
    report = lint_paths([root])
    assert not report.errors, report.errors
    assert [f for f in report.findings if "transformers" in f.path] == []
    assert [p.name for p in python_files(root)] == ["train.py"]


@pytest.mark.parametrize("requirements", ["torch\n", "torch\n# transformers is vendored\n"])
def test_a_package_the_repository_does_not_declare_is_linted(
    tmp_path: Path, requirements: str
) -> None:
    root = write_repo(tmp_path, _files(requirements))
    found = [(Path(f.path).name, f.code) for f in lint_paths([root]).findings]
    assert ("trainer.py", "GT007") in found


def test_a_dependency_after_a_comment_in_pyproject_counts(tmp_path: Path) -> None:
    """A comment with an apostrophe inside ``dependencies = [...]`` is no quoted string."""
    files = _files("")
    del files["requirements.txt"]
    files["pyproject.toml"] = (
        '[project]\nname = "coastal"\ndependencies = [\n'
        "    # the lab's patched copy lives in transformers/\n"
        '    "transformers==4.36.1",\n]\n'
    )
    root = write_repo(tmp_path, files)
    assert [p.name for p in python_files(root)] == ["train.py"]
