"""What ``gpu-training lint`` knows about a module before it checks any rule.

Static facts, computed once per file from its AST (no import, no execution):

* :class:`Imports` — local name → qualified name (``DDP`` → ``torch.nn.parallel.Distributed
  DataParallel``), so calls are recognised however they were imported;
* :class:`Scopes` — every assignment, ``for`` target, ``with ... as`` name and parameter,
  per function, so ``model = DDP(model)`` then ``torch.save(model.state_dict())`` is followed
  back to the wrapper (``self.x`` attributes are shared by the methods of a class);
* :func:`kinds` — what an expression is (``ddp``, ``loader``, ``scaler``, …) through those
  bindings;
* :func:`classify_guard` — whether a condition depends on the rank (``if rank == 0``,
  ``if ctx.is_main_process``, ``if dist.get_rank() != 0``, a name bound to such a test).

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
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = [
    "GUARD_NOT_RANK0",
    "GUARD_RANK0",
    "GUARD_RANK_DEP",
    "Imports",
    "ModuleFacts",
    "Scope",
    "call_name",
    "dotted",
    "iter_scope_nodes",
    "mentions_rank",
]

GUARD_RANK0 = "rank0"
"""The condition holds on rank 0 only."""
GUARD_NOT_RANK0 = "not_rank0"
"""The condition holds on every rank but 0."""
GUARD_RANK_DEP = "rank_dep"
"""The condition holds on some ranks, not all."""

_Pos = tuple[int, int]

# Calls whose result is (or wraps) a known kind of object, by the callee's last name part.
_CALL_KINDS: dict[str, str] = {
    "DistributedDataParallel": "ddp",
    "DDP": "ddp",
    "DataParallel": "dp",
    "FullyShardedDataParallel": "fsdp",
    "FSDP": "fsdp",
    "fully_shard": "fsdp",
    "DistributedSampler": "dist_sampler",
    "make_distributed_sampler": "dist_sampler",
    "GlobalBatchSampler": "dist_sampler",
    "RandomSampler": "local_sampler",
    "SequentialSampler": "local_sampler",
    "WeightedRandomSampler": "local_sampler",
    "SubsetRandomSampler": "local_sampler",
    "DataLoader": "loader",
    "GradScaler": "scaler",
    "ShardedGradScaler": "scaler",
    "CheckpointManager": "ckpt_manager",
    "getLogger": "logger",
    "get_logger": "logger",
    "SummaryWriter": "writer",
    "MixedPrecisionTrainer": "amp_trainer",
    "linear_warmup_cosine_lr": "scheduler",
    "open": "file",
    "mkdtemp": "tempfile",
    "mkstemp": "tempfile",
    "NamedTemporaryFile": "tempfile",
    "TemporaryDirectory": "tempfile",
    "gettempdir": "tempfile",
    "BytesIO": "buffer",
}
# Methods that return their receiver (or a same-kind object): the kind passes through.
_PASSTHROUGH_METHODS = frozenset(
    {"to", "cuda", "cpu", "float", "half", "bfloat16", "double", "train", "eval", "requires_grad_"}
)
_MAIN_PROCESS = re.compile(
    r"^(is_(local_|global_|world_)?(main|master)(_process|_rank)?"
    r"|(local_|global_)?(main|master)_process|(is_)?rank_?(0|zero)"
    r"|is_global_zero|is_world_process_zero)$"
)
_RANK_CALLS = frozenset({"get_rank", "get_local_rank", "get_global_rank", "get_node_local_rank"})
_SINGLE_PROCESS_ATTRS = frozenset({"is_initialized", "is_distributed", "is_available"})


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
    """Local names bound by ``import`` statements, resolved to qualified names."""

    def __init__(self, tree: ast.AST) -> None:
        self.names: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                    else:
                        head = alias.name.split(".")[0]
                        self.names[head] = head
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                for alias in node.names:
                    if alias.name != "*":
                        self.names[alias.asname or alias.name] = f"{base}.{alias.name}".lstrip(".")

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


class ModuleFacts:
    """Imports, scopes, local functions and kinds of one parsed module.

    Args:
        tree: The module's AST.
    """

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.imports = Imports(tree)
        self.module_scope = Scope(tree, None)
        self.scopes: dict[ast.AST, Scope] = {tree: self.module_scope}
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.class_bindings: dict[ast.ClassDef, dict[str, list[ast.expr | None]]] = {}
        self.scope_nodes: dict[ast.AST, list[ast.AST]] = {}
        """Every node of each scope (nested functions excluded), in source order."""
        self._collect(tree.body, self.module_scope, None)

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

    def local_functions(self, call: ast.Call) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """The functions of this file a call may run: ``f(...)``, ``self.f(...)``."""
        func = call.func
        if isinstance(func, ast.Name) and func.id not in self.imports.names:
            return self.functions.get(func.id, [])
        receiver = func.value if isinstance(func, ast.Attribute) else None
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            assert isinstance(func, ast.Attribute)
            return self.functions.get(func.attr, [])
        return []

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
        if tail in _CALL_KINDS and not (tail == "open" and "." in name):
            return frozenset({_CALL_KINDS[tail]})
        if name.startswith("torch.optim.lr_scheduler.") or (
            tail.endswith("LR") and tail[:1].isupper()
        ):
            return frozenset({"scheduler"})
        if name.startswith("torch.optim.") and tail[:1].isupper():
            return frozenset({"optimizer"})
        if name in ("torch.compile",) and call.args:
            return self.kinds(call.args[0], scope, depth + 1)
        if isinstance(call.func, ast.Attribute) and call.func.attr in _PASSTHROUGH_METHODS:
            return self.kinds(call.func.value, scope, depth + 1)
        return frozenset()

    # --- rank guards ----------------------------------------------------------------------

    def mentions_rank(self, expr: ast.AST) -> bool:
        """Whether ``expr`` reads a rank (a name with ``rank`` in it, ``get_rank()``…)."""
        return mentions_rank(expr, self.imports)

    def mentions_main_or_rank(self, expr: ast.AST) -> bool:
        """Whether ``expr`` reads a rank or a main-process flag (``ctx.is_main_process``)."""
        if self.mentions_rank(expr):
            return True
        return any(
            isinstance(node, (ast.Name, ast.Attribute))
            and _MAIN_PROCESS.match(_tail(dotted(node)).lower()) is not None
            for node in ast.walk(expr)
        )

    def classify_guard(self, test: ast.expr, scope: Scope, depth: int = 0) -> str | None:
        """How a condition depends on the rank.

        Returns:
            :data:`GUARD_RANK0` (true on rank 0 only), :data:`GUARD_NOT_RANK0`,
            :data:`GUARD_RANK_DEP` (true on some ranks), or None (rank-independent).
        """
        kind = self._classify(test, scope, depth)
        return None if kind == "single" else kind

    def _classify(self, test: ast.expr, scope: Scope, depth: int) -> str | None:
        if depth > 8:
            return None
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self._classify(test.operand, scope, depth + 1)
            if inner == GUARD_RANK0:
                return GUARD_NOT_RANK0
            if inner == GUARD_NOT_RANK0:
                return GUARD_RANK0
            if inner is None and _tail(dotted(_callee(test.operand))) in _SINGLE_PROCESS_ATTRS:
                return "single"  # `not dist.is_initialized()`: true only without a group
            return inner if inner == GUARD_RANK_DEP else None
        if isinstance(test, ast.BoolOp):
            parts = [self._classify(v, scope, depth + 1) for v in test.values]
            if isinstance(test.op, ast.And):
                for kind in (GUARD_RANK0, GUARD_NOT_RANK0, GUARD_RANK_DEP):
                    if kind in parts:
                        return kind
                return None
            if GUARD_RANK0 in parts and all(p in (GUARD_RANK0, "single") for p in parts):
                return GUARD_RANK0  # `not dist.is_initialized() or dist.get_rank() == 0`
            if any(p in (GUARD_RANK0, GUARD_NOT_RANK0, GUARD_RANK_DEP) for p in parts):
                return GUARD_RANK_DEP
            return None
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            return self._classify_compare(test)
        name = dotted(_callee(test))
        if name is not None and _MAIN_PROCESS.match(_tail(name).lower()):
            return GUARD_RANK0
        if isinstance(test, ast.Name):
            for value in self.lookup(test.id, scope, _start(test)):
                if value is not None and not isinstance(value, ast.Name):
                    return self._classify(value, scope, depth + 1)
        return None

    def _classify_compare(self, test: ast.Compare) -> str | None:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if self.mentions_rank(right) and not self.mentions_rank(left):
            left, right = right, left
            flipped = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}
            op = flipped.get(type(op), op)
        sentinel = isinstance(right, ast.Constant) and right.value is None
        if isinstance(right, ast.UnaryOp) and isinstance(right.op, ast.USub):
            sentinel = isinstance(right.operand, ast.Constant)  # rank == -1
        if sentinel:
            # `rank == -1` / `rank is None`: "not launched distributed" (true on every rank or
            # none); `!= -1`: "launched distributed".
            single = isinstance(op, (ast.Eq, ast.Is))
            return "single" if single and self.mentions_rank(left) else None
        if not self.mentions_rank(left):
            sizes = dotted(left) or ""
            if "world_size" in sizes.lower() and isinstance(right, ast.Constant):
                return "single"  # `world_size == 1`
            return None
        if isinstance(right, ast.Constant) and right.value == 0 and right.value is not False:
            if isinstance(op, (ast.Eq, ast.Is, ast.LtE)):
                return GUARD_RANK0
            if isinstance(op, (ast.NotEq, ast.IsNot, ast.Gt)):
                return GUARD_NOT_RANK0
        if (
            isinstance(right, ast.Constant)
            and right.value == 1
            and isinstance(op, (ast.Lt, ast.GtE))
        ):
            return GUARD_RANK0 if isinstance(op, ast.Lt) else GUARD_NOT_RANK0
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List)):
            values = [e.value for e in right.elts if isinstance(e, ast.Constant)]
            if values == [0]:
                return GUARD_RANK0 if isinstance(op, ast.In) else GUARD_NOT_RANK0
        return GUARD_RANK_DEP


def _is_unwrap(expr: ast.expr) -> bool:
    """``m.module``, ``m._orig_mod``, ``unwrap_model(m)``: the model inside a wrapper."""
    if isinstance(expr, ast.Attribute):
        return expr.attr in ("module", "_orig_mod")
    return isinstance(expr, ast.Call) and _tail(dotted(expr.func)) == "unwrap_model"


def _callee(expr: ast.AST) -> ast.AST:
    """``f`` for ``f()`` (so ``is_main_process()`` reads like ``is_main_process``)."""
    return expr.func if isinstance(expr, ast.Call) else expr


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
            if name is not None and "rank" in _tail(name).lower():
                return True
        elif isinstance(node, ast.Call):
            if _tail(call_name(node, imports)) in _RANK_CALLS:
                return True
        elif isinstance(node, ast.Constant) and node.value in ("RANK", "LOCAL_RANK"):
            return True
    return False
