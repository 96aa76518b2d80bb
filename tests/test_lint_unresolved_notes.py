"""``gpu-training lint``'s note on project imports it could not find names only the project's.

Issue 33 (one answer however it is run: a directory run "says which files it could not
resolve"). A whole-repository run of NVIDIA/NeMo (benchmarks/README.md, "A whole-repository run
of a large tree") noted 1,207 files, most for ``import torch`` and ``import lightning.pytorch``:
the project's names were every package and module name at any depth, and NeMo has a
``nemo/collections/tts/torch/`` and a ``nemo/lightning/``. A package's member can only be
imported through its package, so only the names not inside a package count (the repository's
own top level, a script's directory, a ``src/`` layout).
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint import lint_paths

_FILES = {
    "pkg/__init__.py": "",
    "pkg/lightning/__init__.py": "",
    "pkg/tts/__init__.py": "",
    "pkg/tts/torch/__init__.py": "",
    "utils/__init__.py": "",
    "tools/helpers.py": "def setup():\n    pass\n",
    "scripts/train.py": (
        "import torch\n"
        "import lightning.pytorch as pl\n"
        "from utils.dist import init\n"
        "from helpers import setup\n"
        "from pkg.tts.torch import layers\n"  # found: the package is there
    ),
}


def test_only_names_importable_from_the_top_are_the_projects(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    for name, text in _FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    train = str(tmp_path / "scripts" / "train.py")
    report = lint_paths([tmp_path])
    # utils has no dist.py; helpers is another directory's module (tools/, not on the path)
    assert report.unresolved == [(train, "helpers"), (train, "utils.dist")]
