"""``gpu-training lint`` gives one answer however it is run (issue 33, item 2).

A file linted alone, a sub-directory and the whole repository must report the same findings
for the same file: the files that decide a file's context (the scripts that import it, through
any number of modules, and the modules that define its classes' base classes) are read as
context whichever of them was named. Each repository below is a minimal reproduction, written
here, of a pattern seen in a public repository where the answers differed before.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from bench_scripts import load_benchmark
from gpu_training.diagnostics.lint.report import collect_files, lint_paths

# --- the repositories ----------------------------------------------------------------------------

_CHAIN = {
    # the group is created two imports above the module that writes
    "setup.py": "",
    "pkg/__init__.py": "",
    "main.py": (
        "import torch.distributed as dist\n\n"
        "from pkg.trainer import fit\n\n\n"
        "def main():\n"
        "    dist.init_process_group('gloo')\n"
        "    fit()\n"
        "    dist.destroy_process_group()\n\n\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    ),
    "pkg/trainer.py": (
        "import torch\n\n"
        "from pkg.store import write_weights\n\n\n"
        "def fit():\n"
        "    model = torch.nn.Linear(2, 2)\n"
        "    write_weights(model, 'last.pt')\n"
    ),
    "pkg/store.py": (
        "import torch\n\n\n"
        "def write_weights(model, path):\n"
        "    torch.save(model.state_dict(), path)\n"  # every rank writes the same file: GT007
    ),
}

_BASES = {
    # a subclass overrides the epoch loop over the loader its base class (another module)
    # builds on a shuffling DistributedSampler, and never reseeds it
    ".git/HEAD": "ref: refs/heads/main\n",
    "cl/__init__.py": "",
    "cl/base.py": (
        "import torch.distributed as dist\n"
        "from torch.utils.data import DataLoader, DistributedSampler\n\n\n"
        "class BaseLearner:\n"
        "    def __init__(self, dataset, epochs):\n"
        "        self.epochs = epochs\n"
        "        self.loader = DataLoader(\n"
        "            dataset, batch_size=8, sampler=DistributedSampler(dataset, shuffle=True)\n"
        "        )\n\n"
        "    def fit(self):\n"
        "        self.train_epochs(self.loader)\n\n"
        "    def train_epochs(self, loader):\n"
        "        for epoch in range(self.epochs):\n"  # never reseeded here either: GT005
        "            for batch in loader:\n"
        "                self.step(batch)\n\n"
        "    def step(self, batch):\n"
        "        pass\n"
    ),
    "cl/replay.py": (
        "from .base import BaseLearner\n\n\n"
        "class ReplayLearner(BaseLearner):\n"
        "    def train_epochs(self, loader):\n"
        "        for epoch in range(self.epochs):\n"  # the same order every epoch: GT005
        "            for i, (x, y) in enumerate(loader):\n"
        "                loss = self.model(x, y) + self.model(*self.replay(i))\n"
        "                self.model.backward(loss)\n"
        "                self.model.step()\n"
    ),
    "run.py": (
        "import torch.distributed as dist\n\n"
        "from cl.replay import ReplayLearner\n\n\n"
        "def main(dataset):\n"
        "    dist.init_process_group('nccl')\n"
        "    ReplayLearner(dataset, epochs=3).fit()\n"
        "    dist.destroy_process_group()\n"
    ),
}


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _found(paths: list[Path]) -> set[tuple[str, int, str]]:
    return {(str(Path(f.path).resolve()), f.line, f.code) for f in lint_paths(paths).findings}


def _of(found: set[tuple[str, int, str]], file: Path) -> set[tuple[int, str]]:
    return {(line, code) for path, line, code in found if path == str(file.resolve())}


# --- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "where", "expected"),
    [
        (_CHAIN, "pkg/store.py", {(5, "GT007")}),
        (_BASES, "cl/replay.py", {(6, "GT005")}),
    ],
    ids=["group-two-imports-up", "base-class-in-another-module"],
)
def test_a_file_alone_reports_what_the_repository_run_reports(
    tmp_path: Path, files: dict[str, str], where: str, expected: set[tuple[int, str]]
) -> None:
    """Before, ``lint pkg/store.py`` read only the files that import it directly (not the
    script above them that creates the group), and ``lint cl/replay.py`` did not read the base
    class's module at all: both reported nothing."""
    root = _write(tmp_path, files)
    target = root / where
    assert _of(_found([root]), target) == expected
    assert _of(_found([target]), target) == expected
    assert _of(_found([target.parent]), target) == expected


@pytest.mark.parametrize("files", [_CHAIN, _BASES], ids=["chain", "bases"])
def test_every_file_and_every_directory_gives_the_repository_answer(
    tmp_path: Path, files: dict[str, str]
) -> None:
    root = _write(tmp_path, files)
    whole = _found([root])
    assert whole  # the repository has something to find
    for file in collect_files([root]):
        assert _of(_found([file]), file) == _of(whole, file), file
    for directory in {f.parent for f in collect_files([root])}:
        part = _found([directory])
        assert part == {row for row in whole if Path(row[0]).parent.is_relative_to(directory)}


def test_test_trees_are_not_context_unless_asked(tmp_path: Path) -> None:
    """A unit test that imports the helper runs one process: its call does not make the
    helper's file distributed, as a directory run skips it too."""
    root = _write(
        tmp_path,
        {
            "setup.py": "",
            "store.py": _CHAIN["pkg/store.py"],
            "tests/test_store.py": (
                "import torch.distributed as dist\n\nfrom store import write_weights\n\n\n"
                "def test_write(tmp_path):\n"
                "    dist.init_process_group('gloo')\n"
                "    write_weights(None, tmp_path / 'w.pt')\n"
            ),
        },
    )
    assert lint_paths([root / "store.py"]).findings == []
    assert lint_paths([root]).findings == []
    with_tests = lint_paths([root / "store.py"], include_tests=True).findings
    assert [(f.line, f.code) for f in with_tests] == [(5, "GT007")]


def _one_answer_script() -> ModuleType:
    return load_benchmark("lint_one_answer")


def test_the_benchmark_finds_a_file_that_answers_differently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``benchmarks/lint_one_answer.py``: nothing differs on a repository whose answers agree;
    a lint that reads no context for a file alone (as before) is caught and named."""
    script = _one_answer_script()
    root = _write(tmp_path / "owner+chain", _CHAIN)
    assert script.compare(root) == (5, [])
    assert script.main([str(tmp_path)]) == 0

    real = script.lint_paths

    def without_context(paths: list[Path], **kwargs: object) -> object:
        if len(paths) == 1 and Path(paths[0]).is_file():
            return real([_copy_alone(Path(paths[0]), tmp_path)])
        return real(paths)

    monkeypatch.setattr(script, "lint_paths", without_context)
    checked, differing = script.compare(root)
    assert checked == 5
    # the write in the helper, and the call of it in a distributed script (reported on every rank)
    assert [Path(str(row["file"])).name for row in differing] == ["store.py", "trainer.py"]
    assert [row["repository_only"] for row in differing] == [[(5, "GT007")], [(8, "GT007")]]
    assert script.main([str(tmp_path)]) == 1


def _copy_alone(file: Path, tmp_path: Path) -> Path:
    """The file in a directory of its own: what a lint without context would see."""
    alone = tmp_path / "alone" / file.name
    alone.parent.mkdir(exist_ok=True)
    alone.write_text(file.read_text())
    return alone


def test_a_vendored_package_with_its_own_setup_py_does_not_cut_the_repository_short(
    tmp_path: Path,
) -> None:
    """A script inside a vendored package (its own ``setup.py``) that calls a writing helper of
    the repository above it: alone, it finds the repository (``.git``), not the package, and
    reports the call as the repository's run does."""
    root = _write(
        tmp_path,
        {
            ".git/HEAD": "ref: refs/heads/main\n",
            "proj/__init__.py": "",
            "proj/records.py": (
                "def dump_config(cfg):\n"
                "    with open('config.yaml', 'w') as f:\n"  # every rank: GT007
                "        f.write(str(cfg))\n"
            ),
            "vendor/setup.py": "",
            "vendor/scripts/train.py": (
                "import torch.distributed as dist\n\n"
                "from proj.records import dump_config\n\n\n"
                "def main(cfg):\n"
                "    dist.init_process_group('nccl')\n"
                "    dump_config(cfg)\n"  # the call, reported on every rank: GT007
                "    dist.destroy_process_group()\n"
            ),
        },
    )
    script = root / "vendor" / "scripts" / "train.py"
    whole = _found([root])
    assert _of(whole, script) == {(8, "GT007")}
    assert _of(_found([script]), script) == {(8, "GT007")}
