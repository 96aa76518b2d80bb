"""A copy of a third-party library kept inside a repository (not the repository's code).

Research repositories often carry a patched copy of a library they depend on: a
``transformers/`` package beside ``train.py``, its ``__init__.py`` setting ``__version__ =
"4.36.1"``, and ``transformers==4.36.1`` in ``requirements.txt``. Its trainer's writes and
collectives are the library's, guarded by the library's own checks and run only where the
project builds that trainer: linting it reports hundreds of lines nobody in the repository
wrote. A package directory counts as such a copy when its ``__init__.py`` sets a literal
``__version__`` and the repository declares a dependency of the same name (a
``requirements*.txt``, ``pyproject.toml``, ``setup.py``, ``setup.cfg`` or
``environment.yml`` at its root): a directory run skips it, as it skips installed packages
(:func:`~gpu_training.diagnostics.lint.roots.installed_packages`). The library's own
repository does not list itself as a dependency, so it is linted as usual.

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / ".git").mkdir()
    >>> _ = (root / "requirements.txt").write_text("torch\\ntransformers==4.36.1\\n")
    >>> (root / "transformers").mkdir()
    >>> _ = (root / "transformers" / "__init__.py").write_text('__version__ = "4.36.1"\\n')
    >>> (root / "models").mkdir()
    >>> _ = (root / "models" / "__init__.py").write_text('__version__ = "0.1"\\n')
    >>> vendored_package(root / "transformers"), vendored_package(root / "models")
    (True, False)
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from gpu_training.diagnostics.lint.roots import find_project_root

__all__ = ["vendored_package"]

_VERSION = re.compile(r"^__version__\s*(?::\s*str\s*)?=\s*[\"'][^\"']+[\"']", re.M)
_HEAD_BYTES = 64_000


@functools.lru_cache(maxsize=4096)
def vendored_package(directory: Path) -> bool:
    """Whether ``directory`` is a copy of a library the repository depends on.

    Args:
        directory: A directory of the repository.
    """
    init = directory / "__init__.py"
    try:
        if not init.is_file():
            return False
        with open(init, encoding="utf-8", errors="replace") as handle:
            head = handle.read(_HEAD_BYTES)
    except OSError:
        return False
    if not _VERSION.search(head):
        return False
    root = find_project_root(directory.parent)
    return root is not None and directory.name.lower() in _dependencies(str(root))


@functools.lru_cache(maxsize=64)
def _dependencies(root: str) -> frozenset[str]:
    """The import-style names (``scikit-learn`` -> ``scikit_learn``) of the distributions the
    repository declares it needs: each line of its ``requirements*.txt``, the ``- name`` items
    of an ``environment.yml``, ``dependencies = [...]`` of ``pyproject.toml``,
    ``install_requires`` of ``setup.py`` / ``setup.cfg``."""
    base = Path(root)
    names: list[str] = []
    for path in sorted(base.glob("requirements*.txt")):
        names += [_leading(line) for line in _text(path).splitlines() if not line.startswith("-")]
    for name in ("environment.yml", "environment.yaml"):
        names += re.findall(r"^\s*-\s*([A-Za-z][\w.\-]*)", _text(base / name), re.M)
    for name, pattern in (
        ("pyproject.toml", r"^dependencies\s*=\s*\[(.*?)\]"),
        ("setup.py", r"install_requires\s*=\s*\[(.*?)\]"),
    ):
        text = "\n".join(line.split("#", 1)[0] for line in _text(base / name).splitlines())
        for block in re.findall(pattern, text, re.M | re.S):  # comments out: "CRC32's"
            names += [_leading(q) for q in re.findall(r"[\"']([^\"']+)[\"']", block)]
    for block in re.findall(
        r"install_requires\s*=\s*\n((?:[ \t]+\S.*\n?)+)", _text(base / "setup.cfg")
    ):
        names += [_leading(line) for line in block.splitlines()]
    return frozenset(n.lower().replace("-", "_") for n in names if n)


def _leading(requirement: str) -> str:
    """``transformers`` of ``transformers==4.36.1`` (``""``: a comment, an option, a URL)."""
    match = re.match(r"\s*([A-Za-z][\w.\-]*)\s*(?:\[[^\]]*\])?\s*(?:[=<>~!;@#]|$)", requirement)
    return match.group(1) if match else ""


def _text(path: Path) -> str:
    try:
        if path.is_file():
            return path.read_text(encoding="utf-8", errors="replace")[:_HEAD_BYTES]
    except OSError:
        pass
    return ""
