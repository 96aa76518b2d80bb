"""Modules that cannot be imported: their code never runs, in any process.

``from model.pointcept.datasets import build_dataset`` at the top of a module, where
``model/pointcept/`` is a regular package of the repository (it has an ``__init__.py``) and
holds no ``datasets`` module or package, raises ``ImportError`` when the module is imported or
run: nothing after that line ever executes, so no rank writes, loads or all-reduces there (a
vendored tester whose datasets the repository does not ship). The same holds for a module that
imports such a module at its top. An import inside a function, a ``try`` or an ``if`` may never
run; only the module's own top-level imports count. Not judged: an entry script (an ``if
__name__ == "__main__":`` block or code at its top level: it is run by hand, its training code
is what its author runs once the import is fixed) and imports that follow a change of
``sys.path``. A name a project module does not bind fails the same way (``from src.data import
RLDataset`` where ``src/data/__init__.py`` neither defines, imports nor star-imports it and
holds no such submodule), unless the module may bind names it does not spell (``__getattr__``,
``globals()``, ``sys.modules``).

Example:
    >>> import ast, tempfile
    >>> from pathlib import Path
    >>> from gpu_training.diagnostics.lint.project import Project
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "pkg").mkdir()
    >>> (root / "pkg" / "__init__.py").write_text("")
    0
    >>> _ = (root / "pkg" / "tester.py").write_text("import os\\nfrom pkg.data import load\\n")
    >>> project = Project([root])
    >>> facts = project.add(str(root / "pkg" / "tester.py"),
    ...                     ast.parse((root / "pkg" / "tester.py").read_text()))
    >>> failing_import_line(project, facts)
    2
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import runs_itself
from gpu_training.diagnostics.lint.model import ModuleFacts, dotted
from gpu_training.diagnostics.lint.project import Project

__all__ = ["failing_import_line"]

_MAX_DEPTH = 6
_MEMO = "failing_import_line"
_BOUND = "bound-names"
_SUFFIXES = (".py", ".pyi", ".so", ".pyd", ".pyx")


def _imported(node: ast.stmt) -> list[tuple[str, int]]:
    """The modules a top-level import statement loads: ``(dotted name, level)``."""
    if isinstance(node, ast.Import):
        return [(alias.name, 0) for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [(node.module or "", node.level)]
    return []


def _missing_from_package(project: Project, importer: str, module: str, level: int) -> bool:
    """Whether the module's parent is a regular package of the project with no such member."""
    parts = module.split(".") if module else []
    if not parts or (level == 0 and len(parts) < 2):
        return False  # a top-level name may be installed: only a package's member is known
    parent = project.module_file(importer, ".".join(parts[:-1]), level)
    if parent is None or parent.name != "__init__.py":
        return False  # not the project's, or a namespace package (spread over directories)
    folder = parent.parent
    leaf = parts[-1]
    if (folder / leaf).is_dir():
        return False
    return not any(
        p.name.startswith(leaf + ".") and p.suffix in _SUFFIXES for p in folder.iterdir()
    )


def _bound_names(facts: ModuleFacts) -> set[str] | None:
    """The names a module binds (its scope's bindings and its imports, in any branch; a name a
    class body or a function-level import binds counts too, which only errs towards
    "imports fine"); None when it may bind names it does not spell (a star import, a module
    ``__getattr__``, ``globals()``, ``setattr``, ``vars``, ``sys.modules``)."""
    cached = facts.memo.get(_BOUND)  # asked once per import of the module
    if cached is not None:
        return cached if isinstance(cached, set) else None
    bound = _module_bindings(facts)
    facts.memo[_BOUND] = bound if bound is not None else False
    return bound


def _module_bindings(facts: ModuleFacts) -> set[str] | None:
    if facts.imports.stars or "__getattr__" in facts.toplevel:
        return None
    for node in facts.nodes:
        if isinstance(node, ast.Name) and node.id in ("globals", "setattr", "vars"):
            return None
        if dotted(node) == "sys.modules":
            return None  # `sys.modules[__name__]` replaced or filled
    return {*facts.module_scope.bindings, *facts.imports.names, *facts.imports.origins}


def _name_missing(project: Project, importer: str, node: ast.ImportFrom) -> bool:
    """``from pkg.data import RLDataset`` where ``pkg/data/__init__.py`` (or ``data.py``), a
    file of the project, binds no ``RLDataset`` and holds no such submodule."""
    if node.level == 0 and "." not in (node.module or ""):
        return False  # `from utils import x`: another `utils` may come first on sys.path
    target = project.module_file(importer, node.module or "", node.level)
    if target is None or not target.is_file() or target.suffix != ".py":
        return False
    facts = project.facts_for(target)
    if facts is None:
        return False
    bound = _bound_names(facts)
    if bound is None:
        return False
    for alias in node.names:
        if alias.name == "*" or alias.name in bound:
            continue
        if target.name == "__init__.py":
            folder = target.parent
            if (folder / alias.name).is_dir() or any(
                p.name.startswith(alias.name + ".") and p.suffix in _SUFFIXES
                for p in folder.iterdir()
            ):
                continue  # a submodule
        return True
    return False


def failing_import_line(project: Project, facts: ModuleFacts, depth: int = 0) -> int | None:
    """The line of the first top-level import that raises ``ImportError``, or None.

    Args:
        project: The project (to resolve the imports against the repository).
        facts: The module.
        depth: How many importing modules were followed already.

    Returns:
        The line from which nothing of the module runs; None when its imports resolve (or
        name modules outside the project, which may be installed).
    """
    importer = facts.path
    if importer.startswith("<") or depth > _MAX_DEPTH:
        return None
    if _MEMO in facts.memo:
        cached = facts.memo[_MEMO]
        return cached if isinstance(cached, int) else None
    facts.memo[_MEMO] = None  # an import cycle resolves as "imports fine"
    found: int | None = None
    body = facts.tree.body
    imports = [i for i, node in enumerate(body) if isinstance(node, (ast.Import, ast.ImportFrom))]
    judged = body[: imports[-1] + 1] if imports else []  # nothing below the last import fails
    for node in [] if runs_itself(facts.tree) else judged:  # entry script: not judged
        if any(dotted(n) == "sys.path" for n in ast.walk(node)):
            break  # the imports below resolve against a path set at run time
        if isinstance(node, ast.ImportFrom) and _name_missing(project, importer, node):
            found = node.lineno
            break
        for module, level in _imported(node):
            if _missing_from_package(project, importer, module, level):
                found = node.lineno
                break
            target = project.module_file(importer, module, level)
            other = project.facts_for(target) if target is not None and target.is_file() else None
            fails = other is not None and other is not facts
            if fails and failing_import_line(project, other, depth + 1) is not None:  # type: ignore[arg-type]
                found = node.lineno
                break
        if found is not None:
            break
    facts.memo[_MEMO] = found
    return found
