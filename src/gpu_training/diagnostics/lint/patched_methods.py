"""Functions stored over an object's method: they run where the method is called.

``trainer._save_checkpoint = save_with_lora`` (the original kept in ``orig = trainer.
_save_checkpoint`` and called inside) replaces a method of one of the project's classes: the
new function runs wherever the object calls ``self._save_checkpoint()`` — in a trainer that
saves under ``if self.rank == 0:``, on rank 0 only — not where the assignment stands. The
assignment is therefore no call site of the function (callbacks.py counts a function named but
not called at its registration); the method's own entry context is. A function stored into an
attribute no method of the linted project is named after (``trainer.on_save = hook``) stays a
callback registered where it is stored.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import Any, Protocol
from weakref import WeakKeyDictionary

from gpu_training.diagnostics.lint.context import Ctx
from gpu_training.diagnostics.lint.model import ModuleFacts

__all__ = ["method_names", "method_sites", "methods_named", "patched_names"]


class _Checker(Protocol):
    """What :func:`method_sites` reads of a file's checker (checks.FileChecker)."""

    @property
    def facts(self) -> ModuleFacts:
        """The file's facts."""

    @property
    def patched(self) -> Mapping[int, tuple[ast.AST, str]]:
        """``id(def)`` → ``(def, method name)`` of its functions stored over a method."""

    @property
    def entry(self) -> Mapping[Any, Ctx]:
        """Each function's entry context, once settled."""


_Def = ast.FunctionDef | ast.AsyncFunctionDef
_CACHE: WeakKeyDictionary[object, dict[str, list[tuple[ModuleFacts, _Def]]]] = WeakKeyDictionary()
_NAMES: WeakKeyDictionary[object, frozenset[str]] = WeakKeyDictionary()


def _methods(modules: Iterable[ModuleFacts]) -> dict[str, list[tuple[ModuleFacts, _Def]]]:
    found: dict[str, list[tuple[ModuleFacts, _Def]]] = {}
    for facts in modules:
        for node in facts.nodes:  # the module's one walk
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found.setdefault(item.name, []).append((facts, item))
    return found


def methods_named(
    owner: object, modules: Iterable[ModuleFacts]
) -> dict[str, list[tuple[ModuleFacts, _Def]]]:
    """The methods of the classes of ``modules`` by name (cached per ``owner``, the project)."""
    cached = _CACHE.get(owner)
    if cached is None:
        cached = _CACHE[owner] = _methods(modules)
    return cached


def method_names(facts: ModuleFacts) -> frozenset[str]:
    """The names of the methods of the linted project's classes (this module's alone when
    the module has no project)."""
    project = facts.resolver
    linted = getattr(project, "linted", None)
    if project is None or not isinstance(linted, dict):
        return frozenset(_methods([facts]))
    names = _NAMES.get(project)
    if names is None:
        names = _NAMES[project] = frozenset(methods_named(project, linted.values()))
    return names


def patched_names(subs: list[ast.AST], methods: frozenset[str]) -> dict[int, str]:
    """The function names an expression stores over a method: ``obj.name = func``.

    Args:
        subs: Every node of a statement (``ast.walk``).
        methods: The method names of the project's classes.

    Returns:
        ``id`` of each ``Name`` value assigned to ``<expr>.<method>`` → the method's name.

    Example:
        >>> tree = ast.parse("trainer.save = save_more")
        >>> list(patched_names(list(ast.walk(tree)), frozenset({"save"})).values())
        ['save']
    """
    found: dict[int, str] = {}
    for sub in subs:
        if not isinstance(sub, ast.Assign) or not isinstance(sub.value, ast.Name):
            continue
        attrs = {t.attr for t in sub.targets if isinstance(t, ast.Attribute)}
        if len(attrs) == 1 and len(sub.targets) == 1 and attrs <= methods:
            found[id(sub.value)] = next(iter(attrs))
    return found


def method_sites(
    checkers: Mapping[str, _Checker], project: object
) -> dict[str, dict[int, list[tuple[Ctx, bool]]]]:
    """The call sites of the functions stored over methods: the methods' entry contexts.

    Args:
        checkers: Each linted file's checker, settled (its ``entry`` known), by path.
        project: The project (the cache key of its methods).

    Returns:
        Path → ``id(def)`` → ``(context, False)`` for each method of that name whose file is
        linted (a site that is not every rank's by itself).
    """
    if not any(c.patched for c in checkers.values()):
        return {}
    methods = methods_named(project, [c.facts for c in checkers.values()])
    found: dict[str, dict[int, list[tuple[Ctx, bool]]]] = {}
    for path, checker in checkers.items():
        for key, (_, name) in checker.patched.items():
            for facts, method in methods.get(name, []):
                owner = checkers.get(facts.path)
                ctx = owner.entry.get(method) if owner is not None else None
                if ctx is not None:
                    found.setdefault(path, {}).setdefault(key, []).append((ctx, False))
    return found
