"""``gpu-training lint`` asks each file-wide question once per file, not once per call.

A whole-repository run of diffusers (2,089 files) had grown from 140 s to 215 s of CPU and from
1.75 to 2.15 GB (benchmarks/README.md, "A whole-repository run of a large tree"): answers about
the whole file or the whole repository were recomputed for every call or every ``if`` that
asked. Counted here on a written repository, so that a rule that asks again per call fails
instead of slowing down the next large run: the repository's root is looked up once per file
for the one-GPU-per-process question (it was once per call: 157,674 lookups on diffusers), and
a module's bound names are computed once however many ``from pkg.mod import x`` read it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import gpu_training.diagnostics.lint.single_gpu as single_gpu
import gpu_training.diagnostics.lint.unimportable as unimportable
from gpu_training.diagnostics.lint import lint_paths
from lint_repo import write_repo

_CALLS = 60

_SCRIPT = (
    "import torch\n"
    "import torch.distributed as dist\n"
    "from pkg.mod import a\n"
    "from pkg.mod import b\n"
    "from pkg.mod import c\n"
    "dist.init_process_group('nccl')\n"
    "model = torch.nn.Linear(2, 2).cuda()\n"
    + "".join(f"x{i} = torch.zeros({i}).cuda()\n" for i in range(_CALLS))
    + "dist.destroy_process_group()\n"
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return write_repo(
        tmp_path,
        {
            "train.py": _SCRIPT,
            "pkg/__init__.py": "",
            "pkg/mod.py": "a = 1\nb = 2\nc = 3\n",
        },
    )


def test_the_repository_root_is_looked_up_once_per_file(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    real = single_gpu.repository_of

    def counting(path: str) -> str:
        asked.append(path)
        return real(path)

    monkeypatch.setattr(single_gpu, "repository_of", counting)
    found = lint_paths([repo]).findings
    assert any(f.code == "GT002" for f in found)  # the `.cuda()` calls were checked
    assert asked and len(asked) == len(set(asked)), (
        f"{len(asked)} look-ups, {len(set(asked))} files"
    )


def test_a_module_s_bound_names_are_read_once(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    real = unimportable._module_bindings

    def counting(facts):  # type: ignore[no-untyped-def]
        read.append(facts.path)
        return real(facts)

    monkeypatch.setattr(unimportable, "_module_bindings", counting)
    (repo / "pkg" / "user.py").write_text(
        "from pkg.mod import a\nfrom pkg.mod import b\nfrom pkg.mod import c\n"
    )
    lint_paths([repo / "pkg" / "user.py"])
    assert len(read) == 1, read
