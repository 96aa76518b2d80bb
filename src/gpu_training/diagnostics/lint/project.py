"""Whole-project facts for ``gpu-training lint``: names resolved across the project's modules.

Training scripts keep their distributed setup in helpers: DeiT's ``main.py`` calls
``utils.init_distributed_mode(args)``, which creates the process group, pins the GPU and calls
``setup_for_distributed(args.rank == 0)`` to replace ``builtins.print`` on the other ranks;
``utils.is_main_process()`` returns ``get_rank() == 0``; Swin's ``create_logger(...,
dist_rank=rank)`` gives only rank 0 a console handler. A :class:`Project` follows a script's
imports to the project's own files next to it (``import utils``, ``from util.misc import
...``, ``from .distributed import ...``, re-exports of a package's ``__init__.py``) and
summarises each function it reaches (:class:`~gpu_training.diagnostics.lint.model.Summary`):
does it return a rank-0 test, create or destroy the group, replace ``print``, run a
collective, return a distributed sampler or a per-rank logger? The rules then read a call of
such a helper as what it does. Nothing is imported or run; installed packages (``torch``,
``timm`` when it is not the project) are not read.

Example:
    >>> import ast
    >>> source = "import torch.distributed as dist\\ndef is_main():\\n    return dist.get_rank() == 0\\n"
    >>> project = Project()
    >>> facts = project.add("utils.py", ast.parse(source))
    >>> project.summary((facts, facts.toplevel["is_main"])).rank0
    True
"""

from __future__ import annotations

import ast
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gpu_training.diagnostics.lint.answers import uncached
from gpu_training.diagnostics.lint.calls import is_literal, tail
from gpu_training.diagnostics.lint.collectives import DIST_SETUP_CALLS, direct_collective
from gpu_training.diagnostics.lint.epochs import shuffling_sampler
from gpu_training.diagnostics.lint.flag_returns import flag_expression
from gpu_training.diagnostics.lint.guards import (
    GUARD_RANK0,
    classify_guard,
    guard_locality,
    mentions_main_or_rank,
    rank_derived,
    single_process,
)
from gpu_training.diagnostics.lint.helper_loaders import returns_unsharded_loader
from gpu_training.diagnostics.lint.model import (
    ModuleFacts,
    Scope,
    call_name,
    dotted,
    parse_quietly,
)
from gpu_training.diagnostics.lint.roots import find_project_root
from gpu_training.diagnostics.lint.roots import resolved as _resolved
from gpu_training.diagnostics.lint.setup import global_rank_source
from gpu_training.diagnostics.lint.state_saves import saved_state_parameters
from gpu_training.diagnostics.lint.summary import FuncRef, Summary
from gpu_training.diagnostics.lint.vendored import vendored_package

__all__ = ["Project", "find_project_root"]

_GROUP_CREATORS = frozenset({"init_process_group", "init_distributed"})
# Accelerate's state joins the launcher's process group when it is first built
_STATE_CREATORS = frozenset({"accelerate.Accelerator", "accelerate.PartialState"})
_GROUP_DESTROYERS = frozenset({"destroy_process_group", "cleanup_distributed"})
_LOG_CONFIG = frozenset({"addHandler", "setLevel", "basicConfig", "set_verbosity", "disable"})
_PRINT_TARGETS = frozenset({"builtins.print", "__builtin__.print", "sys.stdout", "sys.stderr"})
_EMPTY = Summary()


class Project:
    """The modules of one lint run and the project files their imports reach.

    Args:
        roots: The directories (and the directories of the files) named on the command line;
            absolute imports are looked up from an importing file's directory up to the root
            that holds it (at least two levels up).
    """

    shipped_only = True  # judge the runs the repository ships (``lint --unshipped``: False)

    def __init__(self, roots: Sequence[str | os.PathLike[str]] = ()) -> None:
        self.roots = [Path(r).resolve() for r in roots]
        self.linted: dict[str, ModuleFacts] = {}
        """The files being linted, by path as given."""
        self._by_file: dict[Path, ModuleFacts | None] = {}
        self._summaries: dict[int, Summary] = {}
        self._busy: set[int] = set()
        self._attributes: dict[str, list[tuple[ModuleFacts, Scope, ast.expr]]] | None = None
        self._module_cache: dict[tuple[Path, str, int], Path | None] = {}
        self._search_cache: dict[Path, list[Path]] = {}
        self._importers: dict[Path, list[ModuleFacts]] | None = None
        self._incoming: dict[int, list[tuple[ModuleFacts, ast.Call, Scope]]] | None = None
        self._members: dict[tuple[Path | None, tuple[str, ...], int, bool], list[FuncRef]] = {}
        self.distributed: set[str] | None = None
        """The linted files that run under a process group, once the checks know."""

    # --- modules ----------------------------------------------------------------------------

    def add(self, path: str, tree: ast.Module) -> ModuleFacts:
        """Register a file being linted (parsed already) and return its facts."""
        facts = ModuleFacts(tree, path, self)
        self.linted[path] = facts
        self._by_file[_resolved(path)] = facts
        self._attributes = None
        self._importers = None
        self._incoming = None
        self._members.clear()
        return facts

    def facts_for(self, path: Path) -> ModuleFacts | None:
        """The facts of a project file (parsed on first use; None when it cannot be read)."""
        key = path if path in self._by_file else _resolved(str(path))  # cached: no lstat
        if key not in self._by_file:
            self._by_file[key] = parse_quietly(key, self)
        return self._by_file[key]

    def module_file(self, importer: str, module: str, level: int) -> Path | None:
        """The file (or namespace directory) an import names, seen from ``importer``.

        Args:
            importer: The importing file.
            module: The dotted module (``util.misc``; ``""`` for ``from . import x``).
            level: The number of leading dots of a relative import.

        Returns:
            ``x.py``, ``x/__init__.py`` or a directory without ``__init__.py``; None when the
            project has no such module (``torch``, the standard library, a vendored copy).
        """
        if importer.startswith("<"):
            return None
        start = _resolved(importer).parent
        key = (start, module, level)
        if key in self._module_cache:
            return self._module_cache[key]
        if level:
            base = start
            for _ in range(level - 1):
                base = base.parent
            bases = [base]
        else:
            bases = self._search_dirs(start)
        found = None
        parts = module.split(".") if module else []
        for base in (b for b in bases if level or not parts or not vendored_package(b / parts[0])):
            target = base.joinpath(*parts)
            if parts and target.with_name(target.name + ".py").is_file():
                found = target.with_name(target.name + ".py")
            elif (target / "__init__.py").is_file():
                found = target / "__init__.py"
            elif parts and target.is_dir() and level == 0 and base == bases[0]:
                found = target  # a namespace package next to the importer
            if found is not None:
                break
        self._module_cache[key] = found
        return found

    def _search_dirs(self, start: Path) -> list[Path]:
        cached = self._search_cache.get(start)
        if cached is not None:
            return cached
        holding = [r for r in self.roots if r == start or r in start.parents]
        limit = min(holding, key=lambda r: len(r.parts)) if holding else None  # the outermost
        dirs = [start]
        for parent in start.parents:
            if limit is not None and parent != limit and limit not in parent.parents:
                if len(dirs) >= 3:
                    break
            elif limit is None and len(dirs) >= 3:
                break
            dirs.append(parent)
        self._search_cache[start] = dirs
        return dirs

    def importers_of(self, facts: ModuleFacts) -> list[ModuleFacts]:
        """The linted files that import ``facts``'s module (directly)."""
        if self._importers is None:
            self._importers = {}
            for other in self.linted.values():
                targets: set[Path] = set()
                stars = [(m, lv, None) for m, lv in other.imports.stars]  # `from .x import *`
                for module, level, symbol in [*other.imports.origins.values(), *stars]:
                    path = self.module_file(other.path, module, level)
                    if path is None:
                        continue
                    targets.add(path)
                    package = path if path.is_dir() else path.parent
                    if symbol and (path.is_dir() or path.name == "__init__.py"):
                        sub = _submodule(package, symbol)  # `from pkg import module`
                        if sub is not None:
                            targets.add(sub)
                for target in targets:
                    self._importers.setdefault(target, []).append(other)
        found = self._importers.get(_resolved(facts.path), [])
        return [f for f in found if f is not facts]

    # --- names ------------------------------------------------------------------------------

    def callees(self, facts: ModuleFacts, func: ast.expr) -> list[FuncRef]:
        """The functions of the project a callee expression names: ``f``, ``self.f``,
        ``utils.f``, ``misc.f`` after ``import util.misc as misc``, an imported ``f``."""
        if isinstance(func, ast.Name):
            if func.id in facts.imports.origins:
                return self._imported(facts, func.id, ["__init__"], 0, classes=True)
            here = [(facts, f) for f in facts.local_functions(ast.Call(func, [], []))]
            return here or self._bound_classes(facts, func)
        if not isinstance(func, ast.Attribute):
            return []
        receiver = func.value
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            return [(facts, f) for f in facts.functions.get(func.attr, [])]
        name = dotted(func)
        if name is not None:
            head, *rest = name.split(".")
            if head in facts.imports.origins and not facts.module_scope.bindings.get(head):
                return self._imported(facts, head, rest, 0)
        local = facts.local_functions(ast.Call(func, [], []))
        if local:
            return [(facts, f) for f in local]
        found: list[FuncRef] = []
        for value in facts.instance_values(receiver):  # `t = Trainer(...)`, Trainer imported
            maker = dotted(value.func)
            head, *path = maker.split(".") if maker else [""]
            if head not in facts.imports.origins or facts.module_scope.bindings.get(head):
                continue
            found += [  # a method of an imported class (`utils.TrainState(...)` alike)
                ref
                for ref in self._imported(facts, head, [*path, func.attr], 0)
                if ref[1].name == func.attr
            ]
            if path:  # `state = utils.make_state(...)`: the class the function returns
                makers = self._imported(facts, head, path, 0)
                found += self._returned_methods(makers, func.attr)
        return found

    def star_callees(self, facts: ModuleFacts, name: str) -> list[FuncRef]:
        """What a bare ``name(...)`` runs when a ``from module import *`` of the project
        brings it: the function, or the class's ``__init__``."""
        for module, level in facts.imports.stars:
            found = self._member(
                self.module_file(facts.path, module, level), [name, "__init__"], 0, True
            )
            if found:
                return found
        return []

    def module_facts(self, facts: ModuleFacts, module: str, level: int) -> ModuleFacts | None:
        """The facts of the project module ``facts`` imports as ``module`` (a package: its
        ``__init__``), or None."""
        path = self.module_file(facts.path, module, level)
        path = path / "__init__.py" if path is not None and path.is_dir() else path
        return self.facts_for(path) if path is not None else None

    def _bound_classes(self, facts: ModuleFacts, func: ast.Name) -> list[FuncRef]:
        """``cls = ReconTrainer`` / ``else: cls = DiffTrainer``, then ``cls(**cfg)``: the
        ``__init__`` of each imported class the name is bound to."""
        found: list[FuncRef] = []
        for value in facts.lookup_all(func.id, facts.scope_containing(func)):
            if isinstance(value, ast.Name) and value.id in facts.imports.origins:
                found += self._imported(facts, value.id, ["__init__"], 0, classes=True)
        return found

    def _returned_methods(self, makers: list[FuncRef], method: str) -> list[FuncRef]:
        """The ``method`` of the classes these project functions return an instance of, in
        their own module (``return TrainState(model, optimizer)``)."""
        found: list[FuncRef] = []
        for owner, func in makers:
            nodes = owner.scope_nodes.get(func, [])
            returned = {
                n.value.id
                for n in nodes
                if isinstance(n, ast.Return) and isinstance(n.value, ast.Name)
            }
            for node in nodes:  # `return TrainState(...)`, or `state = TrainState(...)` returned
                made = node.value if isinstance(node, (ast.Return, ast.Assign)) else None
                if isinstance(node, ast.Assign) and not any(
                    isinstance(t, ast.Name) and t.id in returned for t in node.targets
                ):
                    continue
                if isinstance(made, ast.Call) and isinstance(made.func, ast.Name):
                    cls = owner.toplevel.get(made.func.id)
                    found += [
                        (owner, n)
                        for n in (cls.body if isinstance(cls, ast.ClassDef) else [])
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and n.name == method
                    ]
        return found

    def _imported(
        self, facts: ModuleFacts, head: str, rest: list[str], depth: int, classes: bool = False
    ) -> list[FuncRef]:
        """``classes``: ``rest`` ends with a method name, which a function does not have
        (``Trainer(...)`` runs ``Trainer.__init__``; ``f(...)`` runs ``f``)."""
        module, level, symbol = facts.imports.origins[head]
        if symbol is None:  # `import a.b as head`, or `import a` (then `a.b.f`)
            path = self.module_file(facts.path, module, 0)
            return self._member(path, rest, depth + 1, classes)
        path = self.module_file(facts.path, module, level)
        return self._member(path, [symbol, *rest], depth + 1, classes)

    def _member(
        self, path: Path | None, names: list[str], depth: int, classes: bool = False
    ) -> list[FuncRef]:
        """What ``names`` reach in the module at ``path``, through re-exports and star imports.

        Memoised: a package whose ``__init__`` star-imports its modules, each star-importing
        the next (the standard library's ``asyncio``), reaches one module along many paths,
        which without the memo is exponential in the depth."""
        key = (path, tuple(names), depth, classes)
        if key not in self._members:
            self._members[key] = self._member_uncached(path, names, depth, classes)
        return self._members[key]

    def _member_uncached(
        self, path: Path | None, names: list[str], depth: int, classes: bool
    ) -> list[FuncRef]:
        if path is None or not names or depth > 8:
            return []
        if path.is_dir():
            return self._member(_submodule(path, names[0]), names[1:], depth + 1, classes)
        target = self.facts_for(path)
        if target is None:
            return []
        first, rest = names[0], names[1:]
        node = target.toplevel.get(first)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return [(target, node)] if not rest or (classes and len(rest) == 1) else []
        if isinstance(node, ast.ClassDef):
            if len(rest) == 1:
                return [
                    (target, n)
                    for n in node.body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == rest[0]
                ]
            return []
        if first in target.imports.origins:  # a re-export: `from .distributed import is_primary`
            return self._imported(target, first, rest, depth + 1, classes)
        for module, level in target.imports.stars:  # `from .train_utils import *`
            found = self._member(
                self.module_file(target.path, module, level), names, depth + 1, classes
            )
            if found:
                return found
        if path.name == "__init__.py":
            return self._member(_submodule(path.parent, first), rest, depth + 1, classes)
        return []

    def set_distributed(self, paths: set[str]) -> None:
        """Record which linted files run under a process group, and forget the rank tests
        worked out before it was known (a flag passed by callers depends on which run)."""
        self.distributed = paths
        for facts in self._by_file.values():
            if facts is not None:
                facts.guard_cache.clear()
                for key in [
                    k for k in facts.memo if isinstance(k, tuple) and k[0] == "passed-flag"
                ]:
                    del facts.memo[key]

    def runs_distributed(self, facts: ModuleFacts) -> bool:
        """Whether a linted file runs under a process group (set by the checks; unknown
        files count as distributed)."""
        return self.distributed is None or facts.path in self.distributed

    def incoming(self, ref: FuncRef) -> list[tuple[ModuleFacts, ast.Call, Scope]]:
        """The calls of a function from the other linted files (``verbose=is_primary(args)``
        passed from ``train.py`` into a helper of the package)."""
        if self._incoming is None:
            index: dict[int, list[tuple[ModuleFacts, ast.Call, Scope]]] = {}
            for facts in self.linted.values():
                for node, scope in facts.scopes.items():
                    for sub in facts.scope_nodes.get(node, []):
                        if not isinstance(sub, ast.Call):
                            continue
                        for owner, func in self.callees(facts, sub.func):
                            if owner is not facts:
                                index.setdefault(id(func), []).append((facts, sub, scope))
            self._incoming = index
        return list(self._incoming.get(id(ref[1]), []))

    def attribute_values(self, attr: str) -> list[tuple[ModuleFacts, Scope, ast.expr]]:
        """Every value assigned to ``<anything>.attr`` in the modules read so far."""
        if self._attributes is None:
            index: dict[str, list[tuple[ModuleFacts, Scope, ast.expr]]] = {}
            for facts in [f for f in self._by_file.values() if f is not None]:
                for scope in facts.scopes.values():
                    for key, entries in scope.bindings.items():
                        if "." not in key:
                            continue
                        for _, value in entries:
                            if value is not None:
                                index.setdefault(key.rsplit(".", 1)[1], []).append(
                                    (facts, scope, value)
                                )
            self._attributes = index
        return self._attributes.get(attr, [])

    # --- summaries --------------------------------------------------------------------------

    def summary(self, ref: FuncRef) -> Summary:
        """What a function does (cached; a function being summarised reads as doing nothing,
        so recursion ends)."""
        facts, func = ref
        key = id(func)
        cached = self._summaries.get(key)
        if cached is not None:
            return cached
        if key in self._busy:
            return _EMPTY
        self._busy.add(key)
        try:
            with uncached():
                result = _summarise(self, facts, func)
        finally:
            self._busy.discard(key)
        self._summaries[key] = result
        return result


_INHERITED_FLAGS = (
    "silences_print",
    "destroys_group",
    "sets_device",
    "trains",
    "shuffles_sampler",
    "sets_epoch",
    "spawns",
)


def _summarise(project: Project, facts: ModuleFacts, func: ast.AST) -> Summary:
    assert isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
    scope = facts.scope_of(func)
    here = Path(facts.path).name
    flags = Summary(where=f"{func.name}() ({here}:{func.lineno})")
    nodes = facts.scope_nodes.get(func, [])
    for node in nodes:
        if isinstance(node, ast.Call):
            flags = _merge_call(project, facts, scope, node, flags, here)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(facts.imports.resolve(dotted(t)) in _PRINT_TARGETS for t in targets):
                flags = replace(flags, silences_print=True)
        elif isinstance(node, ast.If) and _configures_logging_by(facts, node, scope):
            flags = replace(flags, rank_logging=True)
    returns = [n.value for n in nodes if isinstance(n, ast.Return) and n.value is not None]
    if len(returns) == 1 and isinstance(returns[0], ast.Name):
        computed = flag_expression(func)  # `flag = True; if ...: flag = False; return flag`
        if computed is not None:
            facts.memo[("flag-expression", id(func))] = computed  # kept alive: ids are keys
            returns = [computed]
    guards = [(v, classify_guard(facts, v, scope)) for v in returns]
    rank0 = [v for v, kind in guards if kind == GUARD_RANK0]
    constant = [v for v in returns if is_literal(v)]  # `return -1` too
    if rank0 and len(rank0) + len(constant) == len(returns):
        local = all(guard_locality(facts, v, scope) == "local" for v in rank0)
        flags = replace(flags, rank0=True, local=local)
    single = [v for v, kind in guards if kind is None and single_process(facts, v, scope)]
    if single and len(single) + len(constant) == len(returns):
        flags = replace(flags, single=True)
    values = [v for v in returns if v not in constant]
    values = [v for v in values if not isinstance(v, ast.Compare | ast.BoolOp)]
    returns_rank = values and len(values) + len(constant) == len(returns)
    if returns_rank and all(rank_derived(facts, v, scope) for v in values):
        where = {guard_locality(facts, v, scope) for v in values}
        flags = replace(flags, rank_value="global" if "global" in where else "local")
    flags = replace(flags, rank_items=_rank_items(facts, returns, scope))
    kinds: frozenset[str] = frozenset()
    for value in returns:
        kinds |= facts.kinds(value, scope)
    flags = replace(flags, unsharded_loader=returns_unsharded_loader(facts, func))
    if flags.rank_logging and "logger" in kinds:
        kinds |= {"rank_logger"}
    return replace(flags, returns=kinds)


def _rank_items(
    facts: ModuleFacts, returns: list[ast.expr], scope: Scope
) -> tuple[tuple[int, str], ...]:
    """The positions of returned tuples that hold a rank on every return (a constant, the
    value without a process group, aside): ``return True, rank, world`` / ``return False, 0, 1``.
    ``"global"`` only where :func:`global_rank_source` proves it."""
    tuples = [v.elts for v in returns if isinstance(v, ast.Tuple)]
    if not tuples or len(tuples) != len(returns) or len({len(t) for t in tuples}) != 1:
        return ()
    items: list[tuple[int, str]] = []
    for index in range(len(tuples[0])):
        values = [t[index] for t in tuples if not isinstance(t[index], ast.Constant)]
        if values and all(global_rank_source(facts, v, scope) for v in values):
            items.append((index, "global"))  # a parameter named rank proves nothing (mp.spawn)
        elif values and all(rank_derived(facts, v, scope) for v in values):
            items.append((index, "local"))
    return tuple(items)


def _merge_call(
    project: Project, facts: ModuleFacts, scope: Scope, call: ast.Call, flags: Summary, here: str
) -> Summary:
    name = call_name(call, facts.imports)
    last = tail(name)
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    changes: dict[str, object] = {}
    if (last in _GROUP_CREATORS or name in _STATE_CREATORS) and flags.creates_group is None:
        changes["creates_group"] = f"{last} ({here}:{call.lineno})"
    if last in _GROUP_DESTROYERS or (
        last == "register" and any(tail(dotted(a)) in _GROUP_DESTROYERS for a in call.args)
    ):
        changes["destroys_group"] = True
    if last in ("set_device", "set_device_index", "init_distributed"):
        changes["sets_device"] = True
    if name == "torch.save" and flags.saves_argument is None:
        saved = _saved_parameter(call, scope)
        if saved is not None:
            changes["saves_argument"] = saved
    if shuffling_sampler(call, facts.imports, facts.toplevel):
        changes["shuffles_sampler"] = True
    if last in ("set_epoch", "train_one_epoch"):
        changes["sets_epoch"] = True
    if name == "torch.save":
        saved_states = saved_state_parameters(facts, call, scope)
        changes["saves_state_of"] = tuple(sorted({*flags.saves_state_of, *saved_states}))
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    if method in ("backward", "zero_grad") or (
        method == "step" and "optim" in tail(dotted(receiver) if receiver else None).lower()
    ):
        changes["trains"] = True
    if name.startswith("torch.distributed.") or last in DIST_SETUP_CALLS:
        changes["distributed"] = True
    if "multiprocessing" in name and last in ("spawn", "start_processes"):
        changes["spawns"] = True
    if last in _LOG_CONFIG and method is not None and mentions_main_or_rank(facts, call):
        changes["rank_logging"] = True  # logger.setLevel(INFO if rank == 0 else WARN)
    if (
        last == "setattr"
        and call.args
        and facts.imports.resolve(dotted(call.args[0]))
        in (
            "builtins",
            "__builtin__",
        )
    ):
        changes["silences_print"] = True
    if flags.collective is None:
        direct = direct_collective(call, scope, facts)
        if direct is not None:
            changes["collective"] = f"{direct} ({here}:{call.lineno})"
    for ref in project.callees(facts, call.func):
        inner = project.summary(ref)
        for field in _INHERITED_FLAGS:
            if getattr(inner, field):
                changes[field] = True
        if inner.distributed or inner.creates_group:
            changes["distributed"] = True
        if inner.creates_group and "creates_group" not in changes and not flags.creates_group:
            changes["creates_group"] = f"{inner.where}, which calls {inner.creates_group}"
        if inner.collective and "collective" not in changes and not flags.collective:
            changes["collective"] = f"{inner.where.split(' (')[0]}, which calls {inner.collective}"
    return replace(flags, **changes) if changes else flags  # type: ignore[arg-type]


def _saved_parameter(call: ast.Call, scope: Scope) -> int | None:
    """``torch.save(state, ...)`` where ``state`` is a parameter: its position (``*args``
    passed through, as in ``save_on_master(*args)``, is position 0)."""
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or not call.args:
        return None
    first = call.args[0]
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    skip = 1 if params and params[0] in ("self", "cls") else 0
    if isinstance(first, ast.Starred) and func.args.vararg is not None:
        vararg = func.args.vararg.arg
        return len(params) - skip if dotted(first.value) == vararg else None
    name = dotted(first)
    return params.index(name) - skip if name in params else None


def _configures_logging_by(facts: ModuleFacts, node: ast.If, scope: Scope) -> bool:
    """``if dist_rank == 0: logger.addHandler(console)``: handlers (or levels) chosen by rank."""
    if classify_guard(facts, node.test, scope) is None:
        return False
    for sub in ast.walk(ast.Module(body=[*node.body, *node.orelse], type_ignores=[])):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in _LOG_CONFIG
        ):
            return True
        if isinstance(sub, ast.Assign) and any(tail(dotted(t)) == "disabled" for t in sub.targets):
            return True
    return False


def _submodule(directory: Path, name: str) -> Path | None:
    for candidate in (directory / f"{name}.py", directory / name / "__init__.py"):
        if candidate.is_file():
            return candidate
    return directory / name if (directory / name).is_dir() else None
