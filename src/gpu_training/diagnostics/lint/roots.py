"""Where a file's repository starts: the directory its imports and launch scripts are read from.

:func:`find_project_root` is the one answer for every part of the linter (the project's import
resolution, the repository's shell scripts and configs). It lives in a module of its own, with
no lint imports, so that every other module can use it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

__all__ = ["find_project_root", "installed_packages", "resolved"]


@functools.cache
def resolved(path: str) -> Path:
    """``path`` with its links resolved (as given when it cannot be), cached."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(path)


_ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg", ".hg")
_MAX_ROOT_DEPTH = 8


def find_project_root(path: str | os.PathLike[str]) -> Path | None:
    """The repository a file or directory belongs to: the nearest directory above it (or it)
    holding ``.git`` (or ``.hg``), at most eight levels up, so that a vendored package's own
    ``setup.py`` inside it does not cut the repository short; else the nearest holding
    ``pyproject.toml``, ``setup.py`` or ``setup.cfg``; None when there is none. A script linted alone resolves its imports from there, as it
    would inside a run over the whole repository.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     (Path(tmp) / "setup.py").write_text("")
        ...     (Path(tmp) / "tools").mkdir()
        ...     find_project_root(Path(tmp) / "tools" / "train.py") == Path(tmp).resolve()
        0
        True
    """
    start = resolved(str(path))
    here = start if start.is_dir() else start.parent
    nearest = None
    for depth, candidate in enumerate([here, *here.parents]):
        if depth > _MAX_ROOT_DEPTH or candidate == Path.home():
            break
        if (candidate / ".git").exists() or (candidate / ".hg").exists():
            return candidate  # the repository, above a vendored package's own setup.py
        if nearest is None and any((candidate / m).exists() for m in _ROOT_MARKERS):
            nearest = candidate
    return nearest


@functools.lru_cache(maxsize=4096)
def installed_packages(directory: Path) -> bool:
    """Whether ``directory`` holds installed distributions: a ``*.dist-info`` directory beside
    the packages, as ``pip install --target packages/`` leaves them (a ``site-packages`` by
    another name). Their code is the libraries', not the repository's: never searched.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "accelerate-1.13.0.dist-info").mkdir()
        >>> installed_packages(root), installed_packages(root.parent)
        (True, False)
    """
    try:
        with os.scandir(directory) as entries:
            return any(e.name.endswith(".dist-info") and e.is_dir() for e in entries)
    except OSError:
        return False
