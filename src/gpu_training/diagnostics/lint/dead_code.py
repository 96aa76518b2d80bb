"""Functions, classes and methods that no running code reaches: what they would do never happens.

A trainer class often keeps methods its ``train()`` no longer calls (``train_epoch`` beside
the loop module that replaced it, a ``save_checkpoint`` method beside the helper of the same
name that is used), and a package keeps a class that only such a method builds. Their
writes, collectives and wrappers run in no process, so a finding inside them is no bug of
the repository.

Reachability is worked out by name, from the code that certainly runs:

* the top level of every linted module runs (imports, module-level statements, the
  ``if __name__ == "__main__":`` block, decorators, default values and base classes, which
  are evaluated when the ``def`` or ``class`` statement runs);
* a module-level function runs when a running piece of code names it (a call, a value
  passed to ``mp.spawn`` or a registry, an attribute of an imported module, a string);
* a class runs (its objects are made) when running code names it; a method of a running
  class runs when running code reads its name as an attribute or a string, when it is a
  special method (``__init__``, ``__call__``) or decorated, or when the class has a base
  (a framework may call it by its own name: ``forward``, a Lightning hook) or reaches its
  own attributes by computed names (``getattr(self, f"train_{mode}")``), or when running
  code uses the class as a value (``fire.Fire(Trainer)``: every method may be called);
* the names of the repository's config and launch files count as named (a Hydra
  ``_target_``, a console entry point).

An import or ``__all__`` names nothing: a package ``__init__`` that re-exports
``DistributedTrainer`` makes no object of it. A name inside a function or method that never
runs names nothing either, which is what lets a class built only by an unused method be
seen as unused too.

The filter judges a script (an ``if __name__ == "__main__":`` block, or a top-level call of
its own function) and a module a linted file imports, in a repository on disk with at least
one such script: a stand-alone snippet, or library code without a script, keeps every
finding.

Example:
    >>> import ast, tempfile
    >>> from pathlib import Path
    >>> from gpu_training.diagnostics.lint.project import Project
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / ".git").mkdir()
    >>> text = ("class Trainer:\\n    def train(self):\\n        return 1\\n"
    ...         "    def train_epoch(self):\\n        return 2\\n"
    ...         "if __name__ == '__main__':\\n    Trainer().train()\\n")
    >>> _ = (root / "train.py").write_text(text)
    >>> project = Project([root])
    >>> _ = project.add(str(root / "train.py"), ast.parse(text))
    >>> dead_spans(project)[str(root / "train.py")]
    [(4, 5)]
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator

from gpu_training.diagnostics.lint.calls import has_main_block
from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.project import Project
from gpu_training.diagnostics.lint.repo_files import text_files
from gpu_training.diagnostics.lint.roots import find_project_root

__all__ = ["dead_spans"]

_CONFIGS = (".yaml", ".yml", ".json", ".toml", ".cfg", ".sh", ".ini")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_Def = ast.FunctionDef | ast.AsyncFunctionDef


def _top_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run with their block, through ``if``/``try``/``with``/loops
    (not into a ``def`` or ``class`` body)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _top_statements(getattr(stmt, field, []) or [])
        for handler in getattr(stmt, "handlers", []) or []:
            yield from _top_statements(handler.body)
        for case in getattr(stmt, "cases", []) or []:
            yield from _top_statements(case.body)


def _mentions(nodes: Iterator[ast.AST], aliases: dict[str, str]) -> tuple[set[str], set[str]]:
    """``(names, attributes)`` the nodes read (an import alias read as the name it imports):
    a string's words count as both."""
    names: set[str] = set()
    attrs: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            attrs.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = set(_WORD.findall(node.value))
            names |= words
            attrs |= words
    names |= {aliases[n] for n in names & aliases.keys()}
    return names, attrs


def _walk_outside(roots: list[ast.AST], skip: set[int]) -> Iterator[ast.AST]:
    """Every node under ``roots`` except imports, ``__all__``, docstrings and the subtrees in
    ``skip``: a string standing alone as a statement is evaluated and dropped, so its words
    name nothing that runs (and reading every docstring's words was most of this walk's time
    on a documented code base)."""
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in skip or isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring, or any other bare literal
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and "__all__" in {
            t.id
            for t in getattr(node, "targets", [getattr(node, "target", None)])
            if isinstance(t, ast.Name)
        }:
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _def_header(node: _Def | ast.ClassDef) -> list[ast.AST]:
    """What runs when the ``def``/``class`` statement runs: decorators, defaults, bases."""
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *node.keywords]
    args = node.args
    return [*node.decorator_list, *args.defaults, *(d for d in args.kw_defaults if d is not None)]


def _computed_self_getattr(cls: ast.ClassDef) -> bool:
    """``getattr(self, <not a literal>)`` somewhere in the class."""
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "getattr"
        and len(n.args) >= 2
        and isinstance(n.args[0], ast.Name)
        and n.args[0].id == "self"
        and not isinstance(n.args[1], ast.Constant)
        for n in ast.walk(cls)
    )


class _Graph:
    """The units of the project (module tops, functions, classes, methods) and what each names."""

    def __init__(self, modules: list[ModuleFacts], private: frozenset[str] = frozenset()) -> None:
        self.functions: dict[str, list[tuple[ModuleFacts, _Def]]] = {}
        self.classes: dict[str, list[tuple[ModuleFacts, ast.ClassDef]]] = {}
        self.methods: dict[int, list[_Def]] = {}  # class id -> its methods
        self.reads: dict[int, tuple[set[str], set[str]]] = {}
        self.value_uses: set[str] = set()  # class names used other than called
        self.tops: list[ast.AST] = []
        self.owner: dict[int, str] = {}  # unit id -> its module's path
        self.private = private  # modules only their own code can name (see dead_spans)
        for facts in modules:
            self._module(facts)

    def _module(self, facts: ModuleFacts) -> None:
        tree = facts.tree
        aliases = {  # `from .model import DDPM as M`: naming `M` names `DDPM`
            a.asname: a.name.rsplit(".", 1)[-1]
            for node in facts.nodes
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for a in node.names
            if a.asname
        }
        defs = [
            s
            for s in _top_statements(tree.body)
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
        skip = {id(d) for d in defs}
        headers = [h for d in defs for h in _def_header(d)]
        top = [*(s for s in tree.body if id(s) not in skip), *headers]
        self.reads[id(tree)] = _mentions(_walk_outside(top, skip), aliases)
        self.tops.append(tree)
        self.owner[id(tree)] = facts.path
        self._values(_walk_outside(top, skip))
        for d in defs:
            if isinstance(d, ast.ClassDef):
                self.classes.setdefault(d.name, []).append((facts, d))
                methods = [
                    s for s in d.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                ]
                self.methods[id(d)] = methods
                own = {id(m) for m in methods}
                body = [
                    *(s for s in d.body if id(s) not in own),
                    *(h for m in methods for h in _def_header(m)),
                ]
                self.reads[id(d)] = _mentions(_walk_outside(body, own), aliases)
                self.owner[id(d)] = facts.path
                for m in methods:
                    self.reads[id(m)] = _mentions(_walk_outside(list(m.body), set()), aliases)
                    self.owner[id(m)] = facts.path
            else:
                self.functions.setdefault(d.name, []).append((facts, d))
                self.reads[id(d)] = _mentions(_walk_outside(list(d.body), set()), aliases)
                self.owner[id(d)] = facts.path

    def _values(self, nodes: Iterator[ast.AST]) -> None:
        """Names used as a value: an argument, an element, an assigned value (not a call)."""
        for node in nodes:
            if isinstance(node, ast.Call):
                values = [*node.args, *(k.value for k in node.keywords)]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                values = [node.value] if node.value is not None else []
            elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                values = list(node.elts)
            elif isinstance(node, ast.Dict):
                values = [v for v in node.values if v is not None]
            else:
                continue
            self.value_uses |= {v.id for v in values if isinstance(v, ast.Name)}

    def live(self, config_words: set[str]) -> set[int]:
        """The ids of every unit (module tree, def, class, method) that runs."""
        live: set[int] = {id(t) for t in self.tops}
        names: set[str] = set(config_words)
        attrs: set[str] = set(config_words)
        own: dict[str, set[str]] = {path: set(config_words) for path in self.private}
        frontier = [id(t) for t in self.tops]
        classes: list[ast.ClassDef] = []

        def named(facts: ModuleFacts, name: str) -> bool:
            if facts.path in self.private:  # only its own running code names it
                return name in own[facts.path]
            return name in names or name in attrs

        while frontier:
            for key in frontier:
                got_names, got_attrs = self.reads[key]
                names |= got_names
                attrs |= got_attrs
                if self.owner.get(key) in own:
                    own[self.owner[key]] |= got_names | got_attrs
            frontier = []
            for name, defs in self.functions.items():
                for facts, func in defs:
                    if id(func) not in live and named(facts, name):
                        live.add(id(func))
                        frontier.append(id(func))
            for name, found in self.classes.items():
                for facts, cls in found:
                    if id(cls) not in live and (named(facts, name) or cls.decorator_list):
                        live.add(id(cls))
                        frontier.append(id(cls))
                        classes.append(cls)
            for cls in classes:
                every = bool(cls.bases or cls.keywords) or cls.name in self.value_uses
                every = every or _computed_self_getattr(cls)
                for method in self.methods[id(cls)]:
                    if id(method) in live:
                        continue
                    if (
                        every
                        or method.decorator_list
                        or (method.name.startswith("__") and method.name.endswith("__"))
                        or method.name in attrs
                    ):
                        live.add(id(method))
                        frontier.append(id(method))
        return live


def _has_entry(facts: ModuleFacts) -> bool:
    """The module runs something itself: a ``__main__`` block, or a top-level call of one of
    its own functions (``main()``)."""
    own = {
        s.name for s in facts.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    return has_main_block(facts.tree) or any(
        isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Call)
        and isinstance(s.value.func, ast.Name)
        and s.value.func.id in own
        for s in facts.tree.body
    )


def _private_scripts(project: Project, judged: list[ModuleFacts]) -> frozenset[str]:
    """The scripts whose functions and classes only their own code can name: a module with
    an entry that no module of the project imports and no string names (``import_module``,
    ``runpy``). Another script's ``load_data()`` calls its own ``load_data``, not theirs."""
    strings: set[str] = set()
    for facts in project.linted.values():
        for node in facts.nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings |= set(_WORD.findall(node.value))
    return frozenset(
        f.path
        for f in judged
        if _has_entry(f)
        and not project.importers_of(f)
        and os.path.splitext(os.path.basename(f.path))[0] not in strings
    )


def dead_spans(project: Project) -> dict[str, list[tuple[int, int]]]:
    """``path -> [(first line, last line)]`` of each function, class and method that no
    running code of the project reaches; empty for a project without a running entry or
    not on disk.

    Args:
        project: The run's project, every file to lint (and its context) added.

    Returns:
        The unreached spans per linted path (decorators included).
    """
    modules = list(project.linted.values())
    judged = [  # a script, or a module a linted file imports: not a stand-alone snippet
        f for f in modules if os.path.isfile(f.path) and (_has_entry(f) or project.importers_of(f))
    ]
    if not judged or not any(_has_entry(f) for f in judged):
        return {}
    roots = {r for f in judged if (r := find_project_root(f.path)) is not None}
    if not roots:
        return {}
    words: set[str] = set()
    for root in sorted(roots):
        for _, text in text_files(str(root), _CONFIGS):
            words |= set(_WORD.findall(text))
    graph = _Graph(modules, _private_scripts(project, judged))
    live = graph.live(words)
    spans: dict[str, list[tuple[int, int]]] = {}
    for facts in judged:
        dead: list[tuple[int, int]] = []
        for stmt in _top_statements(facts.tree.body):
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            parts: list[_Def | ast.ClassDef] = [stmt]
            if isinstance(stmt, ast.ClassDef) and id(stmt) in live:
                parts = list(graph.methods[id(stmt)])
            for part in parts:
                if id(part) not in live:
                    first = min([part.lineno, *(d.lineno for d in part.decorator_list)])
                    dead.append((first, part.end_lineno or part.lineno))
        if dead:
            spans[facts.path] = sorted(dead)
    return spans
