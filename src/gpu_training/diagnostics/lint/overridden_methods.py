"""Methods of a base class that only the single-process path runs: the distributed subclass
overrides them.

A project often has a plain trainer class and a distributed subclass of it (``class
BaseTrainer`` with ``get_train_dataloader`` building a shuffling loader and ``run`` putting
the model on ``torch.device("cuda")``; ``class DistributedTrainer(BaseTrainer)``, whose
``setup`` calls ``init_process_group`` and which overrides both). An object of the subclass
never runs the base class's versions, so under the process group they do not run at all;
they run only for the plain class (a "monolith" command, one process). Findings whose
premise is a process group (every rank reads the same batches, every rank picks the same
GPU) do not apply inside them.

A base-class method is such a method when some subclass in the project joins a process group
(its body, or a base class's, calls ``init_process_group``/``init_distributed`` or wraps in
``DistributedDataParallel``), every such subclass reaches an override of the method before
the base class's in its bases, and no override on the way calls ``super().<name>(...)``;
the base class itself joins no group.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.project import Project
    >>> source = (
    ...     "class Base:\\n"
    ...     "    def loader(self):\\n"
    ...     "        return 1\\n"
    ...     "class Dist(Base):\\n"
    ...     "    def setup(self):\\n"
    ...     "        dist.init_process_group('nccl')\\n"
    ...     "    def loader(self):\\n"
    ...     "        return 2\\n"
    ... )
    >>> project = Project()
    >>> _ = project.add("t.py", ast.parse(source))
    >>> single_process_methods(project)
    {'t.py': [(2, 3)]}
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.model import dotted

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.project import Project

__all__ = ["GROUP_PREMISED", "single_process_methods"]

GROUP_PREMISED = frozenset({"GT002", "GT003", "GT005", "GT013"})
"""Rules whose finding says what every rank of a process group does."""

_JOINS_GROUP = frozenset({"init_process_group", "init_distributed", "DistributedDataParallel"})
_MAX_DEPTH = 6


class _Classes:
    """Every class of the project, by name, with its path."""

    def __init__(self, project: Project) -> None:
        self.where: dict[int, str] = {}
        self.by_name: dict[str, list[ast.ClassDef]] = {}
        for path, facts in project.linted.items():
            for node in facts.nodes:
                if isinstance(node, ast.ClassDef):
                    self.where[id(node)] = path
                    self.by_name.setdefault(node.name, []).append(node)
        self._joins: dict[int, bool] = {}
        self._ancestors: dict[int, list[ast.ClassDef]] = {}
        self._reaches: dict[tuple[int, int, str, int], bool] = {}

    def parents(self, cls: ast.ClassDef) -> list[ast.ClassDef]:
        found: list[ast.ClassDef] = []
        for base in cls.bases:
            name = dotted(base)
            if name is None:
                continue
            named = [c for c in self.by_name.get(name.rsplit(".", 1)[-1], []) if c is not cls]
            local = [c for c in named if self.where[id(c)] == self.where[id(cls)]]
            found += local or named  # a class of the same module shadows the others
        return found

    def ancestors(self, cls: ast.ClassDef) -> list[ast.ClassDef]:
        """Every class above ``cls`` within ``_MAX_DEPTH`` levels, each once (kept: a project
        with many same-named classes, such as vendored copies, made the walk exponential)."""
        cached = self._ancestors.get(id(cls))
        if cached is not None:
            return cached
        found: dict[int, ast.ClassDef] = {}
        level = [cls]
        for _ in range(_MAX_DEPTH + 1):
            level = [p for c in level for p in self.parents(c) if id(p) not in found]
            if not level:
                break
            for parent in level:
                found.setdefault(id(parent), parent)
        result = self._ancestors[id(cls)] = list(found.values())
        return result

    def joins_group(self, cls: ast.ClassDef) -> bool:
        """The class's own body sets up a process group or a DDP wrapper."""
        if id(cls) not in self._joins:
            self._joins[id(cls)] = any(
                isinstance(n, ast.Call)
                and (dotted(n.func) or "").rsplit(".", 1)[-1] in _JOINS_GROUP
                for n in ast.walk(cls)
            )
        return self._joins[id(cls)]

    def distributed(self, cls: ast.ClassDef) -> bool:
        return self.joins_group(cls) or any(self.joins_group(a) for a in self.ancestors(cls))

    def reaches_base(
        self, cls: ast.ClassDef, base: ast.ClassDef, name: str, depth: int = 0
    ) -> bool:
        """Whether ``cls.<name>`` runs ``base``'s method: no class between them defines it,
        or an override on the way hands on to ``super()``."""
        if cls is base:
            return True
        if depth > _MAX_DEPTH:
            return True
        key = (id(cls), id(base), name, depth)
        if key not in self._reaches:
            own = _method(cls, name)
            self._reaches[key] = (own is None or _calls_super(own, name)) and any(
                self.reaches_base(p, base, name, depth + 1) for p in self.parents(cls)
            )
        return self._reaches[key]


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    return next(
        (
            s
            for s in cls.body
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == name
        ),
        None,
    )


def _calls_super(func: ast.AST, name: str) -> bool:
    """``super().name(...)`` or ``Base.name(self, ...)`` inside an override."""
    for node in ast.walk(func):
        if isinstance(node, ast.Attribute) and node.attr == name:
            owner = node.value
            if isinstance(owner, ast.Call) and dotted(owner.func) == "super":
                return True
            if isinstance(owner, ast.Name) and owner.id[:1].isupper():
                return True
    return False


def single_process_methods(project: Project) -> dict[str, list[tuple[int, int]]]:
    """The line spans of base-class methods that every distributed subclass overrides.

    Args:
        project: The project, with every file to lint added.

    Returns:
        Path → ``(first, last)`` line spans of such methods.
    """
    classes = _Classes(project)
    spans: dict[str, list[tuple[int, int]]] = {}
    everything = [c for group in classes.by_name.values() for c in group]
    below: dict[int, list[ast.ClassDef]] = {}
    for cls in everything:
        for ancestor in classes.ancestors(cls):
            below.setdefault(id(ancestor), []).append(cls)
    for base in everything:
        if id(base) not in below or classes.distributed(base):
            continue
        joined = [c for c in below[id(base)] if classes.distributed(c)]
        if not joined:
            continue
        for method in base.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if method.name.startswith("__"):
                continue
            if any(classes.reaches_base(c, base, method.name) for c in joined):
                continue
            end = method.end_lineno or method.lineno
            spans.setdefault(classes.where[id(base)], []).append((method.lineno, end))
    return spans
