"""``repository_of`` and ``find_project_root`` give one answer for a file's repository.

The launch scripts a repository ships are read from the same root its imports are resolved
from: the nearest ``.git``/``.hg`` above the file, else the nearest ``pyproject.toml``/
``setup.py``/``setup.cfg`` (an exported tarball without ``.git``), else the file's own directory.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.project import find_project_root
from gpu_training.diagnostics.lint.repo_files import repository_of


def test_git_root_above_a_vendored_setup(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "setup.py").write_text("")
    script = tmp_path / "vendor" / "train.py"
    assert repository_of(str(script)) == str(find_project_root(script)) == str(tmp_path.resolve())


def test_an_exported_tree_uses_its_setup_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "src").mkdir()
    assert repository_of(str(tmp_path / "src" / "train.py")) == str(tmp_path.resolve())


def test_no_marker_is_the_files_own_directory(tmp_path: Path) -> None:
    script = tmp_path / "deep" / "train.py"
    if find_project_root(script) is None:  # no marker anywhere above the temporary directory
        assert repository_of(str(script)) == str(script.parent)
