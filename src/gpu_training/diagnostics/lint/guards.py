"""Rank guards: which conditions hold on rank 0 only, on the other ranks, or on some ranks.

A guard is recognised by what it computes, not by its spelling:

* a comparison of a rank-derived value with 0 (``rank == 0``, ``dist.get_rank() != 0``,
  ``args.local_rank in [-1, 0]``) or a bare rank as a truth value (``not args.rank``);
* a name bound to such a test (``master_process = ddp_rank == 0``; ``self.is_master = ...``;
  an attribute assigned such a test anywhere in the project, ``args.is_master = ...``);
* a call of a function of the project whose body returns such a test
  (``def is_main_process(): return get_rank() == 0``, however it is named, in whichever
  module), as :mod:`~gpu_training.diagnostics.lint.project` summarises it.

Only names nobody here can read — attributes of a framework's objects
(``accelerator.is_main_process``, ``fabric.is_global_zero``) or functions of an installed
package — fall back to the usual flag names
(:data:`~gpu_training.diagnostics.lint.locality.FLAG_NAMES`).

Whether a rank-0 guard reads the *node-local* rank (``local_rank == 0`` holds once per node)
is :func:`~gpu_training.diagnostics.lint.locality.guard_locality` (re-exported here).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("master = ddp_rank == 0\\nif not master: pass\\n")
    >>> facts = ModuleFacts(tree)
    >>> classify_guard(facts, tree.body[1].test, facts.module_scope)
    'not_rank0'
"""

from __future__ import annotations

import ast
import re

from gpu_training.diagnostics.lint.answers import answers
from gpu_training.diagnostics.lint.calls import call_arg, parameter_index
from gpu_training.diagnostics.lint.env_tests import launcher_variable_test
from gpu_training.diagnostics.lint.fallbacks import (
    SINGLE_PROCESS_ATTRS,
    fallback_kind,
    group_query_call,
    means_group,
)
from gpu_training.diagnostics.lint.group_rank import group_rank_keys, spawn_index_keys
from gpu_training.diagnostics.lint.locality import (
    CURRENT_DEVICE,
    FLAG_NAMES,
    guard_locality,
    rank_zero_decorator,
)
from gpu_training.diagnostics.lint.model import (
    RANK_ATTRS,
    ModuleFacts,
    Scope,
    call_name,
    dotted,
    mentions_rank,
)
from gpu_training.diagnostics.lint.node_flags import value_scope
from gpu_training.diagnostics.lint.rank_calls import rank_call
from gpu_training.diagnostics.lint.rank_flags import switched_off_elsewhere
from gpu_training.diagnostics.lint.rank_name_loops import looped_rank_names
from gpu_training.diagnostics.lint.switches import MULTI, SINGLE, switch_test, world_size_test

__all__ = [
    "GUARD_NOT_RANK0",
    "GUARD_RANK0",
    "GUARD_RANK_DEP",
    "classify_guard",
    "guard_locality",
    "mentions_main_or_rank",
    "rank_derived",
    "rank_zero_decorator",
    "single_process",
]

GUARD_RANK0 = "rank0"
"""The condition holds on rank 0 only."""
GUARD_NOT_RANK0 = "not_rank0"
"""The condition holds on every rank but 0."""
GUARD_RANK_DEP = "rank_dep"
"""The condition holds on some ranks, not all."""
_SINGLE = SINGLE  # true on every rank or on none: `not dist.is_initialized()`, `rank == -1`
_MULTI = MULTI  # true in every process of a group, its negation _SINGLE: `world_size > 1`

_RANK_VALUE = re.compile(r"(^|_)rank$")


def _tail(name: str | None) -> str:
    return "" if name is None else name.rsplit(".", 1)[-1]


def _start(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def classify_guard(facts: ModuleFacts, test: ast.expr, scope: Scope) -> str | None:
    """How a condition depends on the rank.

    Args:
        facts: The module's facts (with its project, if any).
        test: The condition.
        scope: Where it appears.

    Returns:
        :data:`GUARD_RANK0` (true on rank 0 only), :data:`GUARD_NOT_RANK0`,
        :data:`GUARD_RANK_DEP` (true on some ranks), or None (rank-independent).
    """
    kind = _classify(facts, test, scope, 0)
    return None if kind in (_SINGLE, _MULTI) else kind


_MISSING = "?"
_NO_SITES = "no-sites"  # a parameter no caller running distributed passes
_MAX_ATTRIBUTE_VALUES = 8  # an attribute assigned in more places than this is not a flag


def _classify(facts: ModuleFacts, test: ast.expr, scope: Scope, depth: int) -> str | None:
    if depth > 8:
        return None
    cache = answers(facts.guard_cache)
    cached = cache.get(id(test), _MISSING)
    if cached != _MISSING:
        return cached
    cache[id(test)] = None  # a name bound to itself reads as no guard
    kind = _classify_uncached(facts, test, scope, depth)
    cache[id(test)] = kind
    return kind


def _classify_uncached(facts: ModuleFacts, test: ast.expr, scope: Scope, depth: int) -> str | None:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _classify(facts, test.operand, scope, depth + 1)
        if inner == GUARD_RANK0:
            return GUARD_NOT_RANK0
        if inner == GUARD_NOT_RANK0:
            return GUARD_RANK0
        if inner == _MULTI:
            return _SINGLE  # `not (world_size > 1)`
        if inner is None and isinstance(test.operand, ast.Compare):
            return switch_test(facts, test)  # the `else:` of an `if`/`elif` chain on a switch
        callee = test.operand.func if isinstance(test.operand, ast.Call) else test.operand
        last = _tail(dotted(callee))
        if inner is None and (last in SINGLE_PROCESS_ATTRS or means_group(last)):
            return _SINGLE  # `not dist.is_initialized()`, `not args.distributed`: no group
        if inner is None and group_query_call(facts, test.operand):
            return _SINGLE  # `not is_dist()`, whose body asks `dist.is_initialized()`
        return inner if inner == GUARD_RANK_DEP else None
    if isinstance(test, ast.BoolOp):
        parts = [_classify(facts, v, scope, depth + 1) for v in test.values]
        if isinstance(test.op, ast.And):
            for kind in (GUARD_RANK0, GUARD_NOT_RANK0, GUARD_RANK_DEP):
                if kind in parts:
                    return kind
            return None
        if GUARD_RANK0 in parts and all(p in (GUARD_RANK0, _SINGLE) for p in parts):
            return GUARD_RANK0  # `not dist.is_initialized() or dist.get_rank() == 0`
        if GUARD_RANK0 in parts and all(p in (GUARD_RANK0, None) for p in parts):
            # `not args.multiprocessing_distributed or args.rank == 0`: without spawn a run
            # may still be distributed (launched per node, torchrun), and then the first
            # operand holds on every process. (With `rank % ngpus_per_node == 0` the guard
            # stays node-local rank 0: GT017 reports a write under it either way.)
            return GUARD_RANK0 if guard_locality(facts, test, scope) == "local" else None
        if any(p in (GUARD_RANK0, GUARD_NOT_RANK0, GUARD_RANK_DEP) for p in parts):
            return GUARD_RANK_DEP
        return None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        return _classify_compare(facts, test, scope, depth)
    if isinstance(test, ast.IfExp):  # `is_local(a) if local else is_global(a)`: both rank 0
        body = _classify(facts, test.body, scope, depth + 1)
        orelse = _classify(facts, test.orelse, scope, depth + 1)
        if body != orelse:  # `rank == 0 if ddp else True`: see fallbacks
            chooser = _classify(facts, test.test, scope, depth + 1)
            rank0 = fallback_kind(facts, test, scope, (body, orelse), chooser, GUARD_RANK0)
            body = GUARD_RANK0 if rank0 else None
        return body
    if isinstance(test, ast.Call):
        return _classify_call(facts, test)
    if isinstance(test, (ast.Name, ast.Attribute)):
        return _classify_flag(facts, test, scope, depth)
    return None


def _classify_call(facts: ModuleFacts, call: ast.Call) -> str | None:
    summaries = facts.summaries(call)
    if summaries:  # the project's own function: its body says what it computes
        if all(s.rank0 for s in summaries):
            return GUARD_RANK0
        if all(s.rank_value for s in summaries):
            return GUARD_NOT_RANK0  # `if get_rank():` - true on the ranks other than 0
        if all(s.single for s in summaries):
            return _SINGLE  # `def is_running_serially(rank): return rank == -1`
        return None
    name = call_name(call, facts.imports)
    last = _tail(name)
    if rank_call(name):
        return GUARD_NOT_RANK0
    if FLAG_NAMES.match(last.lower()):
        return GUARD_RANK0
    return None


def _classify_flag(
    facts: ModuleFacts, test: ast.Name | ast.Attribute, scope: Scope, depth: int
) -> str | None:
    key = dotted(test)
    if key is None:  # `PartialState().is_last_process`: a framework's flag on a fresh object
        flag = isinstance(test, ast.Attribute) and FLAG_NAMES.match(test.attr.lower())
        return GUARD_RANK0 if flag else None
    if _RANK_VALUE.search(_tail(key).lower()) and _boolean(facts, test, scope):
        return None  # `if self.negative_all_rank:` - a switch every rank reads alike
    every = facts.lookup_all(key, scope)
    if any(_is_none(v) for v in every if v is not None):
        # `saver = None` ... `if is_primary(args): saver = Saver(...)`: set on rank 0 only
        under = facts.assigned_under.get((facts.binding_owner(key, scope), key))
        if under == {True}:
            return GUARD_RANK0
    if switched_off_elsewhere(facts, key, scope, every):
        return GUARD_RANK0
    values = [v for v in facts.lookup(key, scope, _start(test)) if v is not None]
    at = value_scope(facts, key, scope)  # `self.on = on` is read in `__init__`, not here
    if not values and isinstance(test, ast.Name):
        passed = _passed_flag(facts, test.id, scope, depth)
        if passed not in (None, _NO_SITES):
            return passed  # `if verbose:` where every caller passes verbose=is_primary(args)
    kinds = {_classify_value(facts, v, at(v), depth) for v in values if not _is_true(v)}
    if kinds == {GUARD_RANK0}:
        values = [v for v in values if not _is_true(v)]  # `= True` when not distributed
    else:
        kinds = {_classify_value(facts, v, at(v), depth) for v in values}
    attribute = isinstance(test, ast.Attribute) and not key.startswith("self.")
    if not values and attribute and facts.resolver is not None:
        # `args.is_master = args.rank == 0` in another function or module of the project
        assigned = facts.resolver.attribute_values(test.attr)  # type: ignore[union-attr]
        if len(assigned) <= _MAX_ATTRIBUTE_VALUES:
            kinds = {_classify_value(owner, v, where, depth) for owner, where, v in assigned}
            values = [v for _, _, v in assigned]
    if values and len(kinds) == 1 and None not in kinds:
        return kinds.pop()
    last = _tail(key).lower()
    if FLAG_NAMES.match(last):
        return GUARD_RANK0
    if _RANK_VALUE.search(last) and not values:
        return GUARD_NOT_RANK0  # `if args.rank:` - a rank as a truth value
    if values and _RANK_VALUE.search(last) and all(rank_derived(facts, v, scope) for v in values):
        return GUARD_NOT_RANK0
    return switch_test(facts, test) if not _RANK_VALUE.search(last) else None


def _passed_flag(facts: ModuleFacts, name: str, scope: Scope, depth: int) -> str | None:
    """A parameter used as a test, when every call (in its file or another linted file)
    passes it the same kind of rank test."""
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or depth > 4:
        return None
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    keywords = {a.arg for a in func.args.kwonlyargs}
    if name not in params and name not in keywords:
        return None
    key = ("passed-flag", id(func), name)
    if key in facts.memo:
        return facts.memo[key]  # type: ignore[return-value]
    facts.memo[key] = None
    index = parameter_index(func, name)
    sites = [(facts, call, where) for call, where in facts.calls_of(func)]
    if facts.resolver is not None:  # callers that run on every rank (not validate.py)
        resolver = facts.resolver
        sites += [s for s in resolver.incoming((facts, func)) if resolver.runs_distributed(s[0])]
    kinds: set[str | None] = set()
    for owner, call, where in sites:
        value = call_arg(call, index, name)
        if value is None:
            kinds.add(None)  # the default, or unknown
            continue
        if isinstance(value, ast.Name) and owner.lookup(value.id, where, _start(value)) == [None]:
            # passed on from a parameter of the caller, whose own callers decide
            inner = _passed_flag(owner, value.id, where, depth + 1)
            if inner == _NO_SITES:
                continue  # nobody running distributed calls the caller
            kinds.add(inner)
            continue
        kinds.add(_classify_value(owner, value, where, depth + 1))  # `d if rank0 else None`
    result = _NO_SITES if not kinds else (kinds.pop() if len(kinds) == 1 else None)
    facts.memo[key] = result
    return result


def _classify_value(facts: ModuleFacts, value: ast.expr, scope: Scope, depth: int) -> str | None:
    """How the value bound to a flag depends on the rank (`x if rank == 0 else None`: rank 0)."""
    if isinstance(value, ast.IfExp):
        test = _classify(facts, value.test, scope, depth + 1)
        if test in (GUARD_RANK0, GUARD_NOT_RANK0) and _is_none(value.orelse):
            return test  # the object exists where the test holds
        if test in (GUARD_RANK0, GUARD_NOT_RANK0) and _is_none(value.body):
            return GUARD_NOT_RANK0 if test == GUARD_RANK0 else GUARD_RANK0
        return None
    if isinstance(value, ast.Name) and depth > 6:
        return None
    return _classify(facts, value, scope, depth + 1)


def _is_none(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is None


def _is_true(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is True


def _classify_compare(
    facts: ModuleFacts, test: ast.Compare, scope: Scope, depth: int
) -> str | None:
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if (launched := launcher_variable_test(facts, test)) is not None:
        return launched  # `"RANK" in os.environ`: the same in every process of the launch
    if (
        _is_none(right)
        and isinstance(op, (ast.IsNot, ast.Is))
        and not mentions_rank(left, facts.imports)
    ):
        # `writer is not None` where `writer = SummaryWriter() if rank == 0 else None`
        inner = _classify(facts, left, scope, depth + 1)
        if inner in (GUARD_RANK0, GUARD_NOT_RANK0) and isinstance(op, ast.Is):
            return GUARD_NOT_RANK0 if inner == GUARD_RANK0 else GUARD_RANK0
        return inner if inner in (GUARD_RANK0, GUARD_NOT_RANK0) else None
    if rank_derived(facts, right, scope) and not rank_derived(facts, left, scope):
        left, right = right, left
        flipped = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}
        op = flipped.get(type(op), op)
    # `rank == "cpu"`: a rank that holds a word (not "0") is a run without ranks, as -1 is
    word = right.value if isinstance(right, ast.Constant) else None
    sentinel = _is_none(right) or (
        isinstance(word, str)
        and not word.lstrip("-").isdigit()
        and rank_derived(facts, left, scope)
    )
    if isinstance(right, ast.UnaryOp) and isinstance(right.op, ast.USub):
        sentinel = isinstance(right.operand, ast.Constant)  # rank == -1
    if sentinel:
        # `rank == -1` / `rank is None` / `rank == "cpu"`: "not launched distributed" (true
        # on every rank or none); `!= -1`: "launched distributed".
        single = isinstance(op, (ast.Eq, ast.Is))
        return _SINGLE if single and rank_derived(facts, left, scope) else None
    if not rank_derived(facts, left, scope):
        sizes = (dotted(left.func if isinstance(left, ast.Call) else left) or "").lower()
        if ("world_size" in sizes or "num_processes" in sizes) and isinstance(right, ast.Constant):
            return world_size_test(op, right.value)
        return switch_test(facts, test)  # `args.dist == "OFF"`, by what its branches create
    if isinstance(right, ast.Constant) and right.value == 0 and right.value is not False:
        if isinstance(op, (ast.Eq, ast.Is, ast.LtE)):
            return GUARD_RANK0
        if isinstance(op, (ast.NotEq, ast.IsNot, ast.Gt)):
            return GUARD_NOT_RANK0
    if isinstance(right, ast.Constant) and right.value == 1 and isinstance(op, (ast.Lt, ast.GtE)):
        return GUARD_RANK0 if isinstance(op, ast.Lt) else GUARD_NOT_RANK0
    if isinstance(op, (ast.In, ast.NotIn)):
        members = _rank_members(right)
        if members is not None and 0 in members:
            # `rank in {-1, 0}`, `in (-1, 0)`, `in range(1)`: -1 is "not launched
            # distributed", so the test holds on rank 0 only once a group exists
            if all(m < 0 for m in members - {0}):
                return GUARD_RANK0 if isinstance(op, ast.In) else GUARD_NOT_RANK0
        elif members is not None and all(m < 0 for m in members):
            return _SINGLE if isinstance(op, ast.In) else None
    return GUARD_RANK_DEP


def _rank_members(expr: ast.expr) -> set[int] | None:
    """The integers a container literal holds (``{-1, 0}``, ``(0,)``, ``range(1)``), or None
    when it is not one whose members can be read."""
    if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
        members: set[int] = set()
        for element in expr.elts:
            value = _int_constant(element)
            if value is None:
                return None
            members.add(value)
        return members
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == "range"
        and not expr.keywords
        and 1 <= len(expr.args) <= 2
    ):
        bounds = [_int_constant(a) for a in expr.args]
        if any(b is None for b in bounds) or len(bounds) == 0:
            return None
        start, stop = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
        assert start is not None and stop is not None
        if stop - start > 64:
            return None
        return set(range(start, stop))
    return None


def _int_constant(expr: ast.expr) -> int | None:
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        inner = _int_constant(expr.operand)
        return None if inner is None else -inner
    if isinstance(expr, ast.Constant) and type(expr.value) is int:
        return expr.value
    return None


def single_process(facts: ModuleFacts, test: ast.expr, scope: Scope) -> bool:
    """A test true only without a process group: ``not dist.is_initialized()``,
    ``not args.distributed``, ``world_size == 1``, ``local_rank == -1``.

    Example:
        >>> import ast
        >>> from gpu_training.diagnostics.lint.model import ModuleFacts
        >>> facts = ModuleFacts(ast.parse(""))
        >>> single_process(facts, ast.parse("not args.distributed", mode="eval").body,
        ...                facts.module_scope)
        True
    """
    return _classify(facts, test, scope, 0) == _SINGLE


def rank_derived(facts: ModuleFacts, expr: ast.AST, scope: Scope, depth: int = 0) -> bool:
    """Whether an expression's value is a rank: a name that says so (``args.local_rank``),
    ``get_rank()``, ``int(os.environ["RANK"])``, arithmetic on one (``rank % ngpus``), a name
    bound to one (``gpu = int(os.environ["LOCAL_RANK"])``), a parameter every caller in the
    file passes a rank to, or a function of the project that returns one. A call that merely
    takes the rank as an argument (``validate(model, rank)``) is not.

    Example:
        >>> import ast
        >>> from gpu_training.diagnostics.lint.model import ModuleFacts
        >>> tree = ast.parse("g = dist.get_rank()\\nv = evaluate(model, g)\\ng\\nv\\n")
        >>> facts = ModuleFacts(tree)
        >>> [rank_derived(facts, s.value, facts.module_scope) for s in tree.body[2:]]
        [True, False]
    """
    if depth > 4:
        return False
    if isinstance(expr, (ast.Name, ast.Attribute)):
        name = _tail(dotted(expr)).lower()
        if dotted(expr) in group_rank_keys(facts) | spawn_index_keys(facts):
            return True  # `init_process_group(rank=args.gpu)`, `args.gpu = gpu` of a spawn worker
        if "rank" in name and not FLAG_NAMES.match(name):
            return not _boolean(facts, expr, scope)  # `self.negative_all_rank`: a switch
        if name in RANK_ATTRS:
            return True  # `accelerator.local_process_index`: Accelerate's rank under its own name
        key = dotted(expr)
        if key is None or (isinstance(expr, ast.Attribute) and not key.startswith("self.")):
            return False
        values = facts.lookup(key, scope, _start(expr))
        if values == [None] and isinstance(expr, ast.Name):
            if looped_rank_names(facts, expr, scope):
                return True  # `for k in ("RANK", "LOCAL_RANK"): ... os.environ.get(k)`
            return _parameter_gets_rank(facts, expr.id, scope, depth)
        own = key.startswith("self.")  # a value of `self.x = ...` lives in its method
        return any(
            v is not None
            and not isinstance(v, ast.Compare)
            and rank_derived(facts, v, facts.scope_containing(v) if own else scope, depth + 1)
            for v in values
        )
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str) and mentions_rank(expr, facts.imports)
    if isinstance(expr, ast.Subscript):
        index = expr.slice
        if isinstance(index, ast.Constant) and isinstance(index.value, str):
            return mentions_rank(index, facts.imports) or "rank" in index.value.lower()
        return rank_derived(facts, expr.value, scope, depth + 1)
    if isinstance(expr, ast.Call):
        last = _tail(call_name(expr, facts.imports))
        if (
            rank_call(call_name(expr, facts.imports))
            or call_name(expr, facts.imports) in CURRENT_DEVICE
        ):
            return True  # the GPU a process was pinned to: its local rank
        summaries = facts.summaries(expr)
        if summaries:
            return any(s.rank_value for s in summaries)
        if last in ("int", "str", "float", "get", "getenv", "item", "device", "format"):
            parts = list(expr.args)
            if isinstance(expr.func, ast.Attribute):
                parts.append(expr.func.value)  # `os.environ.get("RANK")`, `t.item()`
            return any(rank_derived(facts, a, scope, depth + 1) for a in parts)
        return False
    if isinstance(expr, ast.BinOp):
        return rank_derived(facts, expr.left, scope, depth + 1) or rank_derived(
            facts, expr.right, scope, depth + 1
        )
    if isinstance(expr, ast.UnaryOp):
        return rank_derived(facts, expr.operand, scope, depth + 1)
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):  # `env.get("RANK") or 0`
        ranks = [rank_derived(facts, v, scope, depth + 1) for v in expr.values]
        return any(ranks) and all(
            r or isinstance(v, ast.Constant) for r, v in zip(ranks, expr.values, strict=True)
        )
    if isinstance(expr, ast.IfExp):
        return rank_derived(facts, expr.body, scope, depth + 1) or rank_derived(
            facts, expr.orelse, scope, depth + 1
        )
    if isinstance(expr, ast.JoinedStr):
        return any(
            isinstance(v, ast.FormattedValue) and rank_derived(facts, v.value, scope, depth + 1)
            for v in expr.values
        )
    return False


def _boolean(facts: ModuleFacts, expr: ast.Name | ast.Attribute, scope: Scope) -> bool:
    """A name some binding shows to be a truth value, never a rank: a parameter annotated
    ``bool`` or defaulting to ``True``/``False``, or a name (``self.x``) bound to one."""
    key = dotted(expr)
    if key is None:
        return False
    values = facts.lookup_all(key, scope)
    func = scope.node
    if isinstance(expr, ast.Name) and isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = func.args
        positional = [*args.posonlyargs, *args.args]
        defaults = dict(zip([a.arg for a in positional[::-1]], args.defaults[::-1], strict=False))
        defaults |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d}
        for arg in [*positional, *args.kwonlyargs]:
            default = defaults.get(arg.arg)
            if arg.arg == expr.id and (
                (arg.annotation is not None and dotted(arg.annotation) == "bool")
                or (isinstance(default, ast.Constant) and isinstance(default.value, bool))
            ):
                return True
    for value in values:
        if isinstance(value, ast.Constant) and isinstance(value.value, bool):
            return True
        if isinstance(value, ast.Name) and key.startswith("self."):
            where = facts.scope_containing(value)
            if where is not scope and _boolean(facts, value, where):
                return True
    return False


def _parameter_gets_rank(facts: ModuleFacts, name: str, scope: Scope, depth: int) -> bool:
    """A parameter is a rank when every call of its function in the file passes one
    (``Trainer(model, data, rank)`` into ``__init__(self, model, data, gpu_id)``)."""
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    key = ("parameter-rank", id(func), name)
    cached = facts.memo.get(key)
    if cached is None:
        facts.memo[key] = False  # recursion: a parameter passed to itself is not a rank
        cached = facts.memo[key] = _passed_ranks(facts, func, name, depth)
    return bool(cached)


def _passed_ranks(
    facts: ModuleFacts, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, depth: int
) -> bool:
    if name not in [a.arg for a in [*func.args.posonlyargs, *func.args.args]]:
        return False
    index = parameter_index(func, name)
    passed: list[tuple[ast.expr, Scope]] = []
    for sub, where in facts.calls_of(func):
        value = call_arg(sub, index, name)
        if value is not None:
            passed.append((value, where))
    return bool(passed) and all(rank_derived(facts, v, w, depth + 1) for v, w in passed)


def mentions_main_or_rank(facts: ModuleFacts, expr: ast.AST) -> bool:
    """Whether ``expr`` reads a rank or a main-process flag (``ctx.is_main_process``)."""
    if mentions_rank(expr, facts.imports):
        return True
    for node in ast.walk(expr):
        if isinstance(node, (ast.Name, ast.Attribute)):
            if FLAG_NAMES.match(_tail(dotted(node)).lower()) is not None:
                return True
        elif isinstance(node, ast.Call) and any(s.rank0 for s in facts.summaries(node)):
            return True
    return False
