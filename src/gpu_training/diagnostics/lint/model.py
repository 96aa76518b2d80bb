"""What ``gpu-training lint`` knows about a module before it checks any rule.

Static facts, computed once per file from its AST (no import, no execution):

* :class:`Imports` — local name → qualified name (``DDP`` → ``torch.nn.parallel.Distributed
  DataParallel``), so calls are recognised however they were imported;
* :class:`Scopes` — every assignment, ``for`` target, ``with ... as`` name and parameter,
  per function, so ``model = DDP(model)`` then ``torch.save(model.state_dict())`` is followed
  back to the wrapper (``self.x`` attributes are shared by the methods of a class);
* :func:`kinds` — what an expression is (``ddp``, ``loader``, ``scaler``, …) through those
  bindings, and through the project's helpers (what ``build_sampler(...)`` returns);
* through a :class:`~gpu_training.diagnostics.lint.summary.Resolver` (the project), what a
  function of another module does (:class:`~gpu_training.diagnostics.lint.summary.Summary`).

Whether a condition depends on the rank is :mod:`~gpu_training.diagnostics.lint.guards`.

Example:
    >>> import ast
    >>> tree = ast.parse("from torch.nn.parallel import DistributedDataParallel as DDP\\n"
    ...                  "model = DDP(model)\\nmodel.state_dict()\\n")
    >>> facts = ModuleFacts(tree)
    >>> call = tree.body[2].value
    >>> sorted(facts.kinds(call.func.value, facts.module_scope))
    ['ddp']
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.answers import answers
from gpu_training.diagnostics.lint.kind_calls import CALL_KINDS as _CALL_KINDS
from gpu_training.diagnostics.lint.kind_calls import PASSTHROUGH_METHODS as _PASSTHROUGH_METHODS
from gpu_training.diagnostics.lint.positions import compact
from gpu_training.diagnostics.lint.rank_calls import RANK_CALLS, rank_call

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.summary import FuncRef, Resolver, Summary

__all__ = ["RANK_ATTRS", "RANK_CALLS", "Imports", "ModuleFacts", "Scope", "call_name", "dotted"]
__all__ += ["iter_scope_nodes", "mentions_rank"]


_Pos = tuple[int, int]

RANK_ATTRS = frozenset({"process_index", "local_process_index"})  # Accelerate's ranks
_RANK_ENV = frozenset({"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "PMI_RANK"})


def dotted(expr: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None.

    Example:
        >>> dotted(ast.parse("self.model.module", mode="eval").body)
        'self.model.module'
    """
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def _tail(name: str | None) -> str:
    return "" if name is None else name.rsplit(".", 1)[-1]


class Imports:
    """Local names bound by ``import`` statements, resolved to qualified names.

    Attributes:
        names: Local name → qualified dotted name (``misc`` → ``util.misc``).
        origins: Local name → ``(module, level, symbol)`` as written, for resolving it to a
            file of the project: ``import util.misc as misc`` → ``("util.misc", 0, None)``,
            ``from .utils import f`` → ``("utils", 1, "f")``.
        stars: ``(module, level)`` of each ``from module import *`` (a package's
            ``__init__`` re-exporting its modules' names).
    """

    def __init__(self, tree: ast.AST, nodes: list[ast.AST] | None = None) -> None:
        self.names: dict[str, str] = {}
        self.origins: dict[str, tuple[str, int, str | None]] = {}
        self.stars: list[tuple[str, int]] = []
        for node in ast.walk(tree) if nodes is None else nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                        self.origins[alias.asname] = (alias.name, 0, None)
                    else:
                        head = alias.name.split(".")[0]
                        self.names[head] = head
                        self.origins[head] = (head, 0, None)
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                if any(alias.name == "*" for alias in node.names):
                    self.stars.append((node.module or "", node.level))
                for alias in node.names:
                    if alias.name != "*":
                        local = alias.asname or alias.name
                        self.names[local] = f"{base}.{alias.name}".lstrip(".")
                        self.origins[local] = (node.module or "", node.level, alias.name)

    def resolve(self, name: str | None) -> str | None:
        """The qualified form of a dotted name (its head replaced by what it was imported as)."""
        if name is None:
            return None
        head, _, rest = name.partition(".")
        target = self.names.get(head)
        if target is None:
            return name
        return f"{target}.{rest}" if rest else target


def call_name(call: ast.Call, imports: Imports) -> str:
    """The qualified dotted name of a call's callee (``""`` for ``f()()`` and the like)."""
    return imports.resolve(dotted(call.func)) or ""


def iter_scope_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of ``body`` except the insides of nested functions, lambdas and classes.

    The nested ``def``/``class`` statements themselves are yielded (their names are bound
    here), with their decorators and default values.
    """
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stack.extend(node.decorator_list)
            stack.extend(d for d in node.args.defaults + node.args.kw_defaults if d is not None)
            continue
        if isinstance(node, ast.ClassDef):
            stack.extend(node.decorator_list)
            stack.extend(node.bases)
            continue
        if isinstance(node, ast.Lambda):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


@dataclass
class Scope:
    """One function (or the module): its name bindings, in source order.

    Attributes:
        node: The ``FunctionDef`` (or ``Module``).
        parent: The enclosing scope (None for the module).
        cls: The class a method belongs to (its ``self.x`` bindings are shared).
        bindings: Name (or ``self.attr``) → ``[(position, value or None)]``; the position is
            where the binding takes effect (the end of its statement).
    """

    node: ast.AST
    parent: Scope | None
    cls: ast.ClassDef | None = None
    bindings: dict[str, list[tuple[_Pos, ast.expr | None]]] = field(default_factory=dict)

    def bind(self, key: str | None, pos: _Pos, value: ast.expr | None) -> None:
        if key is not None:
            self.bindings.setdefault(key, []).append((pos, value))


def _end(node: ast.AST) -> _Pos:
    return (getattr(node, "end_lineno", None) or 0, getattr(node, "end_col_offset", None) or 0)


def _start(node: ast.AST) -> _Pos:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _bind_target(scope: Scope, target: ast.expr, value: ast.expr | None, pos: _Pos) -> None:
    if isinstance(target, (ast.Tuple, ast.List)):
        values: list[ast.expr | None]
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            values = list(value.elts)
        else:
            values = [None] * len(target.elts)
        for sub, sub_value in zip(target.elts, values, strict=True):
            _bind_target(scope, sub, sub_value, pos)
    elif isinstance(target, ast.Starred):
        _bind_target(scope, target.value, None, pos)
    else:
        scope.bind(dotted(target), pos, value)


_Func = ast.FunctionDef | ast.AsyncFunctionDef
# torch.nn.Module methods that return the module itself (`model = Net().to(device)`).
_RETURNS_SELF = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16"})


class ModuleFacts:
    """Imports, scopes, local functions and kinds of one parsed module.

    Args:
        tree: The module's AST.
        path: The file it was read from (for resolving imports and for evidence).
        resolver: The project it belongs to (None: the module alone).
    """

    def __init__(
        self, tree: ast.Module, path: str = "<string>", resolver: Resolver | None = None
    ) -> None:
        self.tree = tree
        self.path = path
        self.resolver = resolver
        self.nodes: list[ast.AST] = list(ast.walk(tree))
        """Every node of the module in :func:`ast.walk` order (walked once: the rules share it)."""
        compact(self.nodes)  # an expression's end position goes: the trees are half the memory
        self.calls: list[ast.Call] = [n for n in self.nodes if isinstance(n, ast.Call)]
        self.imports = Imports(tree, self.nodes)
        self.module_scope = Scope(tree, None)
        self.scopes: dict[ast.AST, Scope] = {tree: self.module_scope}
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.class_bindings: dict[ast.ClassDef, dict[str, list[ast.expr | None]]] = {}
        self.scope_nodes: dict[ast.AST, list[ast.AST]] = {}
        """Every node of each scope (nested functions excluded), in source order."""
        self.toplevel: dict[str, ast.stmt] = {
            node.name: node
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }
        """Module-level ``def`` and ``class`` statements by name (what other modules import)."""
        self._collect(tree.body, self.module_scope, None)
        self.guard_cache: dict[int, str | None] = {}
        self.memo: dict[object, object] = {}
        """Answers worth keeping about this module (keyed by the asking function)."""
        self.assigned_under: dict[tuple[int, str], set[bool | str]] = {}
        """``(owner, name)`` → for each non-None assignment, whether only rank 0 ran it
        (filled by the walk: ``saver = None`` / ``if is_primary: saver = Saver()``), and for
        a True/False one ``"False:others"`` (value, and ``rank0``/``others``/``all``)."""
        """How each condition depends on the rank (:mod:`~gpu_training.diagnostics.lint.guards`)."""

    # --- scopes ---------------------------------------------------------------------------

    def _collect(self, body: list[ast.stmt], scope: Scope, cls: ast.ClassDef | None) -> None:
        nodes = self.scope_nodes.setdefault(scope.node, [])
        for node in iter_scope_nodes(body):
            nodes.append(node)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope.bind(node.name, _end(node), None)
                self.functions.setdefault(node.name, []).append(node)
                inner = Scope(node, scope, cls)
                self.scopes[node] = inner
                args = node.args
                for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                    inner.bind(arg.arg, _start(node), None)
                for extra in (args.vararg, args.kwarg):
                    if extra is not None:
                        inner.bind(extra.arg, _start(node), None)
                self._collect(node.body, inner, cls)
            elif isinstance(node, ast.ClassDef):
                scope.bind(node.name, _end(node), None)
                self.class_bindings.setdefault(node, {})
                self._collect(node.body, scope, node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    _bind_target(scope, target, node.value, _end(node))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                value = node.value if isinstance(node, ast.AnnAssign) else None
                if isinstance(node, ast.AugAssign) or node.value is not None:
                    _bind_target(scope, node.target, value, _end(node))
            elif isinstance(node, ast.NamedExpr):
                scope.bind(node.target.id, _end(node), node.value)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                _bind_target(scope, node.target, None, _start(node.body[0]))
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        _bind_target(scope, item.optional_vars, item.context_expr, _end(item))
            if cls is not None and isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    key = dotted(target)
                    if key is not None and key.startswith("self."):
                        self.class_bindings[cls].setdefault(key, []).append(node.value)

    def scope_of(self, node: ast.AST) -> Scope:
        """The scope a ``def`` (or the module) opens."""
        return self.scopes[node]

    def lookup(self, key: str, scope: Scope, pos: _Pos) -> list[ast.expr | None]:
        """The values ``key`` may hold at ``pos`` in ``scope`` (empty: never bound).

        The last binding before ``pos`` in the innermost scope that binds ``key`` wins;
        ``self.x`` looks at every assignment in the methods of the class.
        """
        if key.startswith("self.") and scope.cls is not None:
            return list(self.class_bindings.get(scope.cls, {}).get(key, []))
        current: Scope | None = scope
        first = True
        while current is not None:
            entries = current.bindings.get(key)
            if entries:
                before = [value for at, value in entries if at <= pos] if first else []
                return [before[-1]] if before else [entries[-1][1]]
            current, first = current.parent, False
        return []

    def scope_containing(self, node: ast.AST) -> Scope:
        """The innermost function (or the module) whose body holds ``node``."""
        key = ("scope-of", id(node))
        found = self.memo.get(key)
        if isinstance(found, Scope):
            return found
        best: Scope = self.module_scope
        line = getattr(node, "lineno", 0)
        for func, scope in self.scopes.items():
            if func is self.tree:
                continue
            start, end = getattr(func, "lineno", 0), getattr(func, "end_lineno", 0) or 0
            if start <= line <= end and start >= getattr(best.node, "lineno", 0):
                best = scope
        self.memo[key] = best
        return best

    def binding_owner(self, key: str, scope: Scope) -> int:
        """An id for where ``key`` is bound: its class (``self.x``) or the scope binding it."""
        if key.startswith("self.") and scope.cls is not None:
            return id(scope.cls)
        current: Scope | None = scope
        while current is not None:
            if key in current.bindings:
                return id(current.node)
            current = current.parent
        return id(scope.node)

    def lookup_all(self, key: str, scope: Scope) -> list[ast.expr | None]:
        """Every value ``key`` is bound to in the innermost scope that binds it (all branches:
        ``if distributed: s = DistributedSampler(d)`` / ``else: s = RandomSampler(d)``)."""
        if key.startswith("self.") and scope.cls is not None:
            return list(self.class_bindings.get(scope.cls, {}).get(key, []))
        current: Scope | None = scope
        while current is not None:
            entries = current.bindings.get(key)
            if entries:
                return [value for _, value in entries]
            current = current.parent
        return []

    def local_functions(self, call: ast.Call) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """The functions of this file a call may run: ``f(...)``, ``self.f(...)``,
        ``Trainer(...)`` (its ``__init__``), ``trainer.train()`` after ``trainer = Trainer()``."""
        key = ("local-functions", id(call.func))
        cached = self.memo.get(key)
        if cached is None:
            cached = self.memo[key] = self._local_functions(call)
        return cached  # type: ignore[return-value]

    def calls_of(self, func: ast.AST) -> list[tuple[ast.Call, Scope]]:
        """Every call in this file that may run ``func``, with the scope it is in."""
        index = self.memo.get("calls-of")
        if not isinstance(index, dict):
            sites: dict[int, list[tuple[ast.Call, Scope]]] = {}
            index = sites
            for node, scope in self.scopes.items():
                for sub in self.scope_nodes.get(node, []):
                    if isinstance(sub, ast.Call):
                        for target in self.local_functions(sub):
                            sites.setdefault(id(target), []).append((sub, scope))
            self.memo["calls-of"] = index
        return list(index.get(id(func), []))

    def _local_functions(self, call: ast.Call) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        func = call.func
        if isinstance(func, ast.Name) and func.id not in self.imports.names:
            cls = self.toplevel.get(func.id)
            if isinstance(cls, ast.ClassDef):  # `Trainer(...)` runs its __init__
                return _methods(cls, "__init__")
            return self.functions.get(func.id, [])
        receiver = func.value if isinstance(func, ast.Attribute) else None
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            assert isinstance(func, ast.Attribute)
            return self.functions.get(func.attr, [])
        if isinstance(func, ast.Attribute) and receiver is not None:
            # `trainer = Trainer(...)` ... `trainer.train()`: a method of a class of this file
            found: list[_Func] = []
            for cls in self._classes_of(receiver, set()):
                found += _methods(cls, func.attr)
            return found
        return []

    def _classes_of(self, receiver: ast.expr, seen: set[int]) -> list[ast.ClassDef]:
        """The classes of this file a receiver is an instance of: bound to ``Net(...)``,
        ``Net(...).to(device)`` or a function of this file that returns ``Net(...)``."""
        found: list[ast.ClassDef] = []
        for value in self.instance_values(receiver):
            if id(value) in seen or len(seen) > 16:
                continue
            seen.add(id(value))
            func = value.func
            if isinstance(func, ast.Attribute) and func.attr in _RETURNS_SELF:
                found += self._classes_of(func.value, seen)  # `Net().to(device)`
            elif isinstance(func, ast.Name) and func.id not in self.imports.names:
                cls = self.toplevel.get(func.id)
                if isinstance(cls, ast.ClassDef):
                    found.append(cls)
                    continue
                for made in self.functions.get(func.id, []):  # `def build(): return Net()`
                    for ret in ast.walk(made):
                        if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Call):
                            found += self._classes_of(ret.value, seen)
        return found

    def class_of(self, method: ast.AST) -> ast.ClassDef | None:
        """The top-level class of this file whose body defines ``method``, or None."""
        for node in self.toplevel.values():
            if isinstance(node, ast.ClassDef) and method in node.body:
                return node
        return None

    def instance_values(self, receiver: ast.expr) -> list[ast.Call]:
        """The calls a receiver name was bound to anywhere in the file (``t = Trainer(...)``),
        or the receiver itself when it is a call (``Trainer(...).train()``)."""
        if isinstance(receiver, ast.Call):
            return [receiver]
        key = dotted(receiver)
        if key is None:
            return []
        index = self.memo.get("instance-values")
        if not isinstance(index, dict):
            bound: dict[str, list[ast.expr | None]] = {}
            index = bound
            for scope in self.scopes.values():
                for name, entries in scope.bindings.items():
                    bound.setdefault(name, []).extend(v for _, v in entries)
            for bindings in self.class_bindings.values():
                for name, values in bindings.items():
                    bound.setdefault(name, []).extend(values)
            self.memo["instance-values"] = index
        return [v for v in index.get(key, []) if isinstance(v, ast.Call)]

    def callees(self, call: ast.Call) -> list[FuncRef]:
        """The functions a call may run: of this file, or of the project when it is known."""
        key = ("callees", id(call.func))  # asked of one call by many rules: resolve it once
        found = self.memo.get(key)
        if not isinstance(found, list):
            if self.resolver is not None:
                found = self.resolver.callees(self, call.func)
            else:
                found = [(self, func) for func in self.local_functions(call)]
            self.memo[key] = found
        return list(found)

    def summaries(self, call: ast.Call) -> list[Summary]:
        """:class:`Summary` of each function a call may run (empty: not the project's code)."""
        if self.resolver is None:
            return []
        return [self.resolver.summary(ref) for ref in self.callees(call)]

    def mentions_rank(self, expr: ast.AST) -> bool:
        """Whether ``expr`` reads a rank by name (``args.local_rank``, ``get_rank()``…)."""
        return mentions_rank(expr, self.imports)

    # --- kinds ----------------------------------------------------------------------------

    def kinds(self, expr: ast.AST | None, scope: Scope, depth: int = 0) -> frozenset[str]:
        """What ``expr`` is, as far as names and assignments show: ``{"ddp"}``, ``{"loader"}``…

        Args:
            expr: An expression (None: unknown).
            scope: Where it appears.
            depth: Recursion guard (names bound to themselves, long chains).

        Returns:
            A set of kind names; empty when unknown. ``"number"`` marks a numeric constant.
        """
        if expr is None or depth > 12:
            return frozenset()
        kept = answers(self.memo)  # a name rebound many times: each binding once per depth
        key = ("kinds", id(expr), id(scope.node), depth)
        known = kept.get(key)
        if not isinstance(known, frozenset):
            known = kept[key] = self._kinds(expr, scope, depth)
        return known

    def _kinds(self, expr: ast.AST, scope: Scope, depth: int) -> frozenset[str]:
        if isinstance(expr, ast.Constant):
            is_number = isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)
            return frozenset({"number"}) if is_number else frozenset()
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
            return self.kinds(expr.operand, scope, depth + 1) & {"number"}
        if isinstance(expr, ast.BinOp):
            left = self.kinds(expr.left, scope, depth + 1)
            right = self.kinds(expr.right, scope, depth + 1)
            return frozenset({"number"}) if "number" in left and "number" in right else frozenset()
        if isinstance(expr, ast.IfExp):
            if _is_unwrap(expr.body) or _is_unwrap(expr.orelse):
                return frozenset()  # `model.module if ddp else model`: the bare model either way
            return self.kinds(expr.body, scope, depth + 1) | self.kinds(
                expr.orelse, scope, depth + 1
            )
        if isinstance(expr, ast.NamedExpr):
            return self.kinds(expr.value, scope, depth + 1)
        if isinstance(expr, ast.Call):
            return self._call_kinds(expr, scope, depth)
        key = dotted(expr)
        if key is None:
            return frozenset()
        qualified = self.imports.resolve(key) or key
        if qualified.startswith("torch.optim.lr_scheduler."):
            return frozenset({"scheduler_class"})
        result: frozenset[str] = frozenset()
        for value in self.lookup(key, scope, _start(expr)):
            if value is not expr:
                result |= self.kinds(value, scope, depth + 1)
        return result

    def _call_kinds(self, call: ast.Call, scope: Scope, depth: int) -> frozenset[str]:
        name = call_name(call, self.imports)
        tail = _tail(name)
        if tail == "get_logger" and name.startswith("accelerate."):
            return frozenset({"logger", "rank_logger"})  # logs on the main process by default
        if tail in _CALL_KINDS and not (tail == "open" and "." in name):
            return frozenset({_CALL_KINDS[tail]})
        if name.startswith("torch.optim.lr_scheduler.") or (
            tail.endswith("LR") and tail[:1].isupper()
        ):
            return frozenset({"scheduler"})
        if name.startswith("torch.optim.") and tail[:1].isupper():
            return frozenset({"optimizer"})
        if name in ("torch.compile", "copy.deepcopy") and call.args:  # still the wrapper
            return self.kinds(call.args[0], scope, depth + 1)
        found: frozenset[str] = frozenset()
        if isinstance(call.func, ast.Attribute) and call.func.attr in _PASSTHROUGH_METHODS:
            found = self.kinds(call.func.value, scope, depth + 1)  # `model.train()`: model
        for summary in self.summaries(call):  # the project's (`trainer.train()`): it returns
            found |= summary.returns
        return found


def _methods(cls: ast.ClassDef, name: str) -> list[_Func]:
    return [
        node
        for node in cls.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
    ]


def _is_unwrap(expr: ast.expr) -> bool:
    """``m.module``, ``m._orig_mod``, ``unwrap_model(m)``: the model inside a wrapper."""
    if isinstance(expr, ast.Attribute):
        return expr.attr in ("module", "_orig_mod")
    return isinstance(expr, ast.Call) and _tail(dotted(expr.func)) == "unwrap_model"


def mentions_rank(expr: ast.AST, imports: Imports) -> bool:
    """Whether ``expr`` reads a rank: a name with ``rank`` in its last part, ``get_rank()``,
    ``os.environ["LOCAL_RANK"]``.

    Example:
        >>> imports = Imports(ast.parse(""))
        >>> mentions_rank(ast.parse("f'ckpt_{args.local_rank}.pt'", mode="eval").body, imports)
        True
        >>> mentions_rank(ast.parse("'ckpt.pt'", mode="eval").body, imports)
        False
    """
    for node in ast.walk(expr):
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = dotted(node)
            last = _tail(name).lower()
            if "rank" in last or last in RANK_ATTRS:
                return True
        elif isinstance(node, ast.Call):
            if rank_call(call_name(node, imports)):
                return True
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (node.value.endswith("RANK") or node.value in _RANK_ENV)  # GROUP_RANK, SLURM_*
        ):
            return True
    return False


_MAX_IMPORTED_BYTES = 2_000_000  # an imported module larger than this is not read


def parse_quietly(path: Path, resolver: Resolver) -> ModuleFacts | None:
    """An imported (not linted) module's facts; None when it cannot be read or parsed."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_IMPORTED_BYTES:
            return None
        data = path.read_bytes()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        tree = ast.parse(data.decode(encoding), filename=str(path))
    except (OSError, SyntaxError, ValueError, LookupError, UnicodeDecodeError, RecursionError):
        return None
    return ModuleFacts(tree, str(path), resolver)
