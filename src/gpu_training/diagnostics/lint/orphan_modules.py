"""Modules the repository never imports nor runs: the code in their functions never executes.

A repository that vendors a library (``src/diffsynth/``) or keeps an old copy of a helper
(``evaluation.py`` beside the ``evaluator.py`` its scripts import) ships code that no
process of its runs: nothing imports the module, it is no script (no ``if __name__ ==
"__main__":`` block; the modules importing it are orphans too), and no launcher, config or string names it. Its functions and
classes never execute in any rank, so what they would write, all-reduce or pin is no bug
of this repository. Such a module is judged an orphan only where the rest of its code base
is in use, i.e. a linted file imports a module beside it (the same directory, or the same
top-level package, by path or by its dotted name): a directory of stand-alone snippets, or one file linted alone, keeps
every finding. The module's own top level still runs if someone runs the file.

A sub-package is an orphan the same way (:func:`_orphan_package`): its ``__init__.py``
re-exports its modules (``from .trainer import SFTTrainer``), so each of them is imported,
but by a module that never runs when nothing outside the package imports the package or
any module in it, nothing runs one of its modules, and no string or file names it
(``pkg.sft``, ``pkg/sft/__init__.py``). A top-level package is left alone: what installs
or runs it is not followed here.

Example:
    >>> import ast, tempfile
    >>> from pathlib import Path
    >>> from gpu_training.diagnostics.lint.project import Project
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / ".git").mkdir()
    >>> texts = {"evaluator.py": "def score():\\n    return 1\\n",
    ...          "evaluation.py": "def old_score():\\n    return 0\\n",
    ...          "train.py": "from evaluator import score\\nif __name__ == '__main__':\\n    score()\\n"}
    >>> project = Project([root])
    >>> for name, text in texts.items():
    ...     _ = (root / name).write_text(text)
    ...     _ = project.add(str(root / name), ast.parse(text))
    >>> [Path(f.path).name for f in project.linted.values() if orphan_module(project, f)]
    ['evaluation.py']
"""

from __future__ import annotations

import ast
import functools
import weakref
from pathlib import Path

from gpu_training.diagnostics.lint.calls import runs_itself
from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.project import Project
from gpu_training.diagnostics.lint.repo_files import repository_of, text_files

__all__ = ["orphan_module", "unrun_spans"]

_TEXT_SUFFIXES = (
    ".sh",
    ".bash",
    ".slurm",
    ".yaml",
    ".yml",
    ".md",
    ".rst",
    ".txt",
    ".cfg",
    ".toml",
    ".json",
    ".ipynb",
    "Makefile",
    ".job",
    ".sbatch",
    ".ini",
)


def _package_top(path: Path) -> Path:
    """The top directory of the package holding ``path`` (its own directory when the file
    is in no package)."""
    top = path.parent
    while (top / "__init__.py").is_file() and (top.parent / "__init__.py").is_file():
        top = top.parent
    return top


def _absolute_imports(facts: ModuleFacts) -> frozenset[str]:
    """The dotted names a module's absolute imports name (``a.b`` and ``a.b.c`` for ``from
    a.b import c``), star imports included."""
    cached = facts.memo.get("absolute-imports")
    if isinstance(cached, frozenset):
        return cached
    names: set[str] = set()
    for node in facts.nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    found = facts.memo["absolute-imports"] = frozenset(names)
    return found


def _names(path: Path, top: Path) -> tuple[str, str]:
    """The module's dotted name and its file path, from above its top package
    (``diffsynth.trainers.utils``, ``diffsynth/trainers/utils.py``; ``evaluation``,
    ``evaluation.py`` for a module in no package)."""
    base = top.parent if (top / "__init__.py").is_file() else top
    parts = path.with_suffix("").relative_to(base).parts
    return ".".join(parts), "/".join(parts) + ".py"


class _Index:
    """What every candidate module is checked against, read once per project: each linted
    module's resolved path, and every string constant of them, joined by NUL (a substring
    search over one text instead of a walk over every node of every module per candidate)."""

    def __init__(self, project: Project) -> None:
        self.count = len(project.linted)
        self.paths = {
            facts.path: Path(facts.path).resolve()
            for facts in project.linted.values()
            if not facts.path.startswith("<")
        }
        strings = (text for facts in project.linted.values() for text in _code_strings(facts))
        self.strings = "\0" + "\0".join(strings) + "\0"
        self._under: dict[Path, list[ModuleFacts]] | None = None
        self._trees: dict[tuple[Path, bool], list[ModuleFacts]] = {}
        self.by_name: dict[str, list[ModuleFacts]] = {}
        for facts in project.linted.values():
            prefixes: set[str] = set()
            for name in _absolute_imports(facts):
                parts = name.split(".")
                prefixes.update(".".join(parts[: i + 1]) for i in range(len(parts)))
            for prefix in prefixes:
                self.by_name.setdefault(prefix, []).append(facts)

    def importers_under(self, project: Project, directory: Path) -> list[ModuleFacts]:
        """The linted modules that import a module or package inside ``directory`` (a
        resolved path), by a path the project resolves; built once, per ancestor directory."""
        if self._under is None:
            self._under = {}
            for other in project.linted.values():
                for module, level, _ in other.imports.origins.values():
                    target = project.module_file(other.path, module, level)
                    if target is None:
                        continue
                    for parent in (target.resolve(), *target.resolve().parents):
                        users = self._under.setdefault(parent, [])
                        if not users or users[-1] is not other:
                            users.append(other)
        return self._under.get(directory, [])

    def tree(self, project: Project, top: Path, *, flat: bool) -> list[ModuleFacts]:
        """The linted modules under ``top`` (``flat``: directly in it), once per directory."""
        key = (top, flat)
        found = self._trees.get(key)
        if found is None:
            found = self._trees[key] = [
                other
                for other in project.linted.values()
                if other.path in self.paths
                and self.paths[other.path].is_relative_to(top)
                and (not flat or self.paths[other.path].parent == top)
            ]
        return found

    def importers_by_name(self, dotted: str) -> list[ModuleFacts]:
        """The linted modules whose absolute imports name the module or package ``dotted``
        (or one of its submodules), whether or not the import resolves to a file here."""
        return self.by_name.get(dotted, [])

    def named_in_strings(self, dotted: str, file_path: str) -> bool:
        """A string of a linted module names the module (``importlib.import_module(
        "pkg.mod")``, ``"pkg.mod:main"`` in an entry point, ``"mod.py"`` in a command)."""
        text = self.strings
        starts = (f"\0{dotted}\0", f"\0{dotted}.", f"\0{dotted}:")
        return file_path in text or any(start in text for start in starts)


_INDEXES: weakref.WeakKeyDictionary[Project, _Index] = weakref.WeakKeyDictionary()


def _code_strings(facts: ModuleFacts) -> list[str]:
    """The module's string constants, docstrings and other bare strings left out: a string
    evaluated and dropped names no module (and docstrings were most of the index's text)."""
    bare = {id(n.value) for n in facts.nodes if isinstance(n, ast.Expr)}
    return [
        n.value
        for n in facts.nodes
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in bare
    ]


def _index(project: Project) -> _Index:
    index = _INDEXES.get(project)
    if index is None or index.count != len(project.linted):
        index = _INDEXES[project] = _Index(project)
    return index


@functools.lru_cache(maxsize=64)
def _repository_text(root: str) -> str:
    return "\n".join(text for _, text in text_files(root, _TEXT_SUFFIXES))


def orphan_module(project: Project, facts: ModuleFacts) -> bool:
    """Whether ``facts`` is a module of the linted code base that nothing imports or runs
    while a module beside it is imported (see the module's text)."""
    cached = facts.memo.get("orphan-module")
    if isinstance(cached, bool):
        return cached
    facts.memo["orphan-module"] = found = _orphan(project, facts)
    return found


def _orphan(project: Project, facts: ModuleFacts) -> bool:
    path = Path(facts.path)
    if path.name == "__init__.py" and not facts.path.startswith("<"):
        return _orphan_package(project, facts, path.resolve().parent)
    if facts.path.startswith("<") or path.name in ("setup.py", "conftest.py"):
        return False
    if len(project.linted) < 2 or runs_itself(facts.tree):
        return False
    facts.memo["orphan-module"] = False  # an import cycle: imported
    top = _package_top(path.resolve())
    dotted, file_path = _names(path.resolve(), top)
    index = _index(project)
    importers = [
        *project.importers_of(facts),
        *index.importers_by_name(dotted),  # a package installed from src/, say
    ]
    if any(not orphan_module(project, other) for other in importers if other is not facts):
        return False  # imported by a module that runs (not by another orphan only)
    same_tree = [
        other
        for other in index.tree(project, top, flat=top == path.resolve().parent)
        if other is not facts
    ]
    package = dotted.split(".")[0] if "." in dotted else None
    if not any(i is not facts for o in same_tree for i in project.importers_of(o)) and not (
        package and any(o is not facts for o in index.importers_by_name(package))
    ):
        return False  # nothing of this code base is imported: stand-alone files
    if index.named_in_strings(dotted, file_path):
        return False
    text = _repository_text(repository_of(facts.path))
    named = file_path in text or ("." in dotted and dotted in text)
    return not named


def _orphan_package(project: Project, facts: ModuleFacts, package: Path) -> bool:
    """Whether a sub-package's ``__init__.py`` never runs: nothing outside the package
    imports it or a module in it (or only orphans do), none of its modules runs itself, and
    nothing names it (see the module's text)."""
    if len(project.linted) < 2 or not (package.parent / "__init__.py").is_file():
        return False  # a top-level package (or no package): installed or run from outside
    facts.memo["orphan-module"] = False  # an import cycle: imported
    index = _index(project)
    members = [
        other
        for other in project.linted.values()
        if other.path in index.paths and index.paths[other.path].is_relative_to(package)
    ]
    if any(runs_itself(member.tree) for member in members):
        return False  # `python pkg/sft/train.py` runs the package's code
    top = _package_top(package / "__init__.py")
    dotted, file_path = _names(package / "__init__.py", top)
    dotted = dotted.removesuffix(".__init__")
    importers = [*index.importers_under(project, package), *index.importers_by_name(dotted)]
    outside = [
        other
        for other in importers
        if other.path not in index.paths or not index.paths[other.path].is_relative_to(package)
    ]
    if any(not orphan_module(project, other) for other in outside):
        return False
    inside = {id(member) for member in members}
    if not any(project.importers_of(o) for o in project.linted.values() if id(o) not in inside):
        return False  # nothing of this code base is imported: stand-alone files
    if index.named_in_strings(dotted, file_path):
        return False
    text = _repository_text(repository_of(facts.path))
    return file_path not in text and dotted not in text


def unrun_spans(facts: ModuleFacts) -> list[tuple[int, int]]:
    """The line spans of the module's top-level functions and classes."""
    return [
        (node.lineno, node.end_lineno or node.lineno)
        for node in facts.tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
