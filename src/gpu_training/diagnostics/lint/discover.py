"""Where a lint run's files sit in their repository: the test trees a directory run leaves out,
the repository's files that import the linted ones (their call sites are context), and the
imports of the project's own modules that cannot be found.

A file linted alone should get the answer a run over its repository gives: its imports are
resolved from the repository root (:func:`~gpu_training.diagnostics.lint.project.find_project_root`)
and the files that call its functions are read too (:func:`importers`), not reported.

Example:
    >>> is_test_file(("tests", "test_ddp.py")), is_test_file(("train.py",))
    (True, False)
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

from gpu_training.diagnostics.lint.class_bases import base_modules
from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.project import Project
from gpu_training.diagnostics.lint.roots import installed_packages
from gpu_training.diagnostics.lint.vendored import vendored_package

__all__ = [
    "SKIP_DIRS",
    "context_files",
    "importers",
    "is_test_file",
    "python_files",
    "unresolved",
]

SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})
"""Directories never searched for Python files (hidden ones neither)."""
_TEST_DIRS = frozenset({"test", "tests", "testing", "unittests", "unit_tests"})


def is_test_file(parts: tuple[str, ...] | list[str]) -> bool:
    """Whether a path (its parts below the directory searched) is in a test tree.

    Example:
        >>> is_test_file(("src", "model_test.py")), is_test_file(("testing_utils.py",))
        (True, False)
    """
    *dirs, name = parts
    if any(d.lower() in _TEST_DIRS for d in dirs):
        return True
    stem = name.rsplit(".", 1)[0]
    return stem.startswith("test_") or stem.endswith("_test") or stem == "conftest"


def _searched(directory: Path, name: str) -> bool:
    """A subdirectory a search goes into: not hidden, not :data:`SKIP_DIRS`, not
    :func:`~gpu_training.diagnostics.lint.roots.installed_packages` nor a copy of a library
    (:func:`~gpu_training.diagnostics.lint.vendored.vendored_package`)."""
    return (
        not name.startswith(".")
        and name not in SKIP_DIRS
        and not installed_packages(directory / name)
        and not vendored_package(directory / name)
    )


def python_files(root: Path, *, include_tests: bool = False) -> list[Path]:
    """The ``.py`` files under ``root``, sorted; hidden, :data:`SKIP_DIRS` and installed
    distributions' directories skipped (:func:`_searched`), and test trees unless
    ``include_tests``."""
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if _searched(Path(directory), d))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(directory) / name
            if include_tests or not is_test_file(path.relative_to(root).parts):
                found.append(path)
    return found


_MAX_PROJECT_FILES = 5000
_MAX_CONTEXT_BYTES = 1_000_000


def importers(
    files: list[Path],
    repositories: list[Path],
    project: Project,
    *,
    include_tests: bool,
    skip: set[Path] | None = None,
    texts: dict[Path, str | None] | None = None,
) -> list[Path]:
    """The files of the linted files' repositories that import one of them (and are not
    linted themselves): their call sites decide the context of the linted helpers (a save in
    ``utils.py`` every caller of which guards with rank 0), as in a run over the repository.

    ``skip``: files already in the run (default: ``files``); ``texts``: a cache of the
    repositories' file texts, shared between calls."""
    if not repositories or not files:
        return []
    linted = {_real(f) for f in files}
    skip = linted if skip is None else skip
    texts = {} if texts is None else texts
    stems = {f.stem for f in files if f.stem != "__init__"} | {
        f.parent.name for f in files if f.stem == "__init__"
    }
    if not stems:
        return []
    pattern = re.compile(
        r"^\s*(?:from\s+\S*\b(?:%s)\b\S*\s+import|import\s+[^\n]*\b(?:%s)\b"
        r"|from\s+\S+\s+import\s+[^\n]*\b(?:%s)\b)" % (("|".join(map(re.escape, stems)),) * 3),
        re.M,
    )
    found: list[Path] = []
    for repository in repositories:
        candidates = python_files(repository, include_tests=include_tests)
        if len(candidates) > _MAX_PROJECT_FILES:
            continue
        for candidate in candidates:
            if _real(candidate) in skip or candidate in found:
                continue
            text = texts[candidate] if candidate in texts else _context_text(candidate)
            texts[candidate] = text
            if (
                text is not None
                and pattern.search(text)
                and _imports_one_of(project, candidate, text, linted)
            ):
                found.append(candidate)
    return found


def context_files(
    project: Project, repositories: list[Path], roots: list[Path], *, include_tests: bool
) -> list[Path]:
    """Add to ``project`` every file a run over the linted files' repositories would let
    decide their findings and that is not linted itself (read, not reported): the files that
    import a linted one, the project modules it imports (a helper's own write decides the
    finding at the call into it), the modules defining the base classes of its classes, and in
    turn theirs, transitively.

    So ``lint train.py`` answers as ``lint .`` does for ``train.py``: ``utils.py`` imported by
    ``trainer.py`` imported by ``main.py`` gets the process group ``main.py`` creates; a
    subclass in ``agem.py`` runs the epoch loop its base class in ``vanilla.py`` builds, which
    ``main.py`` starts under a process group. A test tree is context only with
    ``include_tests``; a repository of more than 5,000 files gives no importers.

    Args:
        project: The run's project, with the linted files added.
        repositories: Their repositories' roots (:func:`find_project_root`).
        roots: The directories named on the command line (and those of the files).
        include_tests: Whether test trees belong to the run.

    Returns:
        The context files added, in the order they were found.
    """
    known = {_real(Path(name)) for name in project.linted}
    frontier = [Path(name) for name in project.linted]
    texts: dict[Path, str | None] = {}
    found: list[Path] = []
    while frontier:
        new = importers(
            frontier, repositories, project, include_tests=include_tests, skip=known, texts=texts
        )
        for path in frontier:
            facts = project.facts_for(_real(path))
            if facts is None:
                continue
            below = [_real(Path(base.path)) for base in base_modules(facts, project)]
            for where in [*below, *_imported_files(project, facts)]:
                if where not in known and _inside(where, repositories or roots, include_tests):
                    new.append(where)
        frontier = []
        for path in new:
            if _real(path) in known:
                continue
            known.add(_real(path))
            tree = _parsed(texts[path] if path in texts else _context_text(path), path)
            if tree is not None:
                project.add(str(path), tree)
                found.append(path)
                frontier.append(path)
    return found


def _imported_files(project: Project, facts: ModuleFacts) -> list[Path]:
    """The project's files a module imports (``import utils``, ``from pkg import mod``,
    ``from .io import save``): their own findings (a helper's write) decide findings at the
    calls into them (GT007 at the call of another module's writing helper)."""
    found: list[Path] = []
    for module, level, symbol in facts.imports.origins.values():
        target = project.module_file(facts.path, module, level)
        if target is None:
            continue
        if target.is_file():
            found.append(_real(target))
        if symbol and (target.is_dir() or target.name == "__init__.py"):
            package = target if target.is_dir() else target.parent
            for candidate in (package / f"{symbol}.py", package / symbol / "__init__.py"):
                if candidate.is_file():
                    found.append(_real(candidate))
                    break
    return list(dict.fromkeys(found))


def _inside(path: Path, tops: list[Path], include_tests: bool) -> bool:
    for top in tops:
        top = _real(top)
        if top == path or top in path.parents:
            return include_tests or not is_test_file(path.relative_to(top).parts)
    return False


def _context_text(path: Path) -> str | None:
    try:
        if path.stat().st_size > _MAX_CONTEXT_BYTES:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _parsed(text: str | None, path: Path) -> ast.Module | None:
    if text is None:
        return None
    try:
        return ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError, RecursionError):
        return None


def _imports_one_of(project: Project, path: Path, text: str, linted: set[Path]) -> bool:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return False
    for node in ast.walk(tree):
        targets: list[tuple[str, int]] = []
        if isinstance(node, ast.Import):
            targets = [(a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            targets = [(base, node.level)]
            targets += [(f"{base}.{a.name}".lstrip("."), node.level) for a in node.names]
        for module, level in targets:
            target = project.module_file(str(path), module, level)
            if target is not None and _real(target) in linted:
                return True
    return False


def unresolved(project: Project, name: str, repositories: list[Path]) -> list[str]:
    """The imports of a linted file that name a module of its project that cannot be found
    from it (a relative import to nowhere; ``from utils.dist import ...`` where the project has
    a ``utils`` somewhere else): helpers there are not read, so what they do is unknown."""
    facts = project.linted[name]
    tops = _project_top_names(tuple(repositories))
    missing: list[str] = []
    for node in facts.nodes:
        if isinstance(node, ast.Import):
            modules = [(a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [(node.module or "", node.level)]
        else:
            continue
        for module, level in modules:
            top = module.split(".")[0]
            if not level and (top not in tops or top in sys.stdlib_module_names):
                continue  # not the project's: torch, the standard library (`timm/typing.py`)
            if project.module_file(name, module, level) is None:
                missing.append("." * level + module)
    return list(dict.fromkeys(missing))


_TOP_CACHE: dict[tuple[Path, ...], frozenset[str]] = {}


def _project_top_names(repositories: tuple[Path, ...]) -> frozenset[str]:
    """The names the repositories' packages and modules can be imported by from the top (any
    depth, tests aside): each one not inside a package, since a script's own directory or one
    put on the path is not a package. A package's member is not (NeMo's
    ``nemo/collections/tts/torch/`` is no ``torch``: ``import torch`` is not noted)."""
    cached = _TOP_CACHE.get(repositories)
    if cached is None:
        names: set[str] = set()
        for repository in repositories:
            files = python_files(repository)
            if len(files) > _MAX_PROJECT_FILES:
                continue
            packages: dict[Path, bool] = {}
            for file in files:
                directory = repository
                for part in file.relative_to(repository).parts:
                    if directory not in packages:
                        packages[directory] = (directory / "__init__.py").is_file()
                    if directory == repository or not packages[directory]:
                        names.add(part[:-3] if part.endswith(".py") else part)
                    directory = directory / part
        names -= {"__init__", "src", "lib"}
        cached = _TOP_CACHE[repositories] = frozenset(names)
    return cached


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path
