"""A dataset that shards itself across the ranks (``GT003`` needs no sampler for it).

A ``DataLoader`` with no sampler still gives each rank its own data when the dataset does
the splitting: an ``IterableDataset`` whose ``__iter__`` reads ``get_rank()`` and strides
or skips by it, a map-style ``Dataset`` built with ``rank=``/``world_size=`` that keeps its
own slice, a Hugging Face ``datasets`` object passed through ``.shard(num_shards=world,
index=rank)`` or ``split_dataset_by_node``. The dataset is followed from the loader's first
argument through the names (and ``self.`` attributes) it is bound to, into the classes of
the project it is built from: one whose methods consult the rank for anything but a
rank-zero test (``if get_rank() == 0: print(...)``) is taken to shard itself.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("class Stream(IterableDataset):\\n    def __iter__(self):\\n"
    ...        "        r = dist.get_rank()\\n        yield from self.rows[r::8]\\n"
    ...        "def f():\\n    ds = Stream()\\n    return DataLoader(ds)\\n")
    >>> tree = ast.parse(src)
    >>> facts = ModuleFacts(tree)
    >>> loader = tree.body[1].body[1].value
    >>> dataset_shards_itself(facts, loader.args[0], facts.scope_of(tree.body[1]))
    True
"""

from __future__ import annotations

import ast
import re

from gpu_training.diagnostics.lint.calls import call_arg, parameter_index, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted

__all__ = ["dataset_shards_itself"]

_WORDS = re.compile(r"rank|world_size|num_replicas", re.I)
_SHARD_CALLS = frozenset({"shard", "split_dataset_by_node"})
_RANK_NAME = re.compile(r"(^|_)rank(_id|_idx|_index)?$|^world_size$|^num_replicas$")
_METHODS = ("__init__", "__iter__", "__getitem__", "__len__", "setup", "shard")


def dataset_shards_itself(
    facts: ModuleFacts, dataset: ast.expr, scope: Scope, depth: int = 0
) -> bool:
    """Whether the dataset a loader reads splits itself by rank.

    Args:
        facts: The module's facts.
        dataset: The loader's dataset expression.
        scope: The scope the loader is built in.
        depth: How many names have been followed already.

    Returns:
        True when the dataset (or a binding of its name) is built with the rank or world
        size, sharded by ``.shard(...)``/``split_dataset_by_node``, or an instance of a
        project class whose methods consult the rank.
    """
    if depth > 3:
        return False
    for value in _values(facts, dataset, scope):
        if _WORDS.search(ast.unparse(value)):
            return True
        for node in ast.walk(value):
            if not isinstance(node, ast.Call):
                continue
            if tail(call_name(node, facts.imports)) in _SHARD_CALLS or _class_shards(facts, node):
                return True
            if _local_class_shards(facts, node, scope):
                return True
            names = [a for a in node.args if isinstance(a, ast.Name) and value is not dataset]
            if any(dataset_shards_itself(facts, a, scope, depth + 1) for a in names):
                return True  # `Wrapper(base)`, base bound to a sharded dataset
        if any(dataset_shards_itself(facts, a, at, depth + 1) for a, at in _passed(facts, value)):
            return True  # `self.train_dataset = train_dataset`, handed to the constructor
    return False


def _passed(facts: ModuleFacts, value: ast.expr) -> list[tuple[ast.expr, Scope]]:
    """What the file's calls pass for ``value`` when it is a parameter of the function it is
    read in (``Trainer(model, train_dataset=InterleavedStream(..., rank=rank))`` for the
    ``train_dataset`` its ``__init__`` keeps): each argument, with the caller's scope."""
    if not isinstance(value, ast.Name):
        return []
    func = facts.scope_containing(value).node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    if value.id not in {
        a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]
    }:
        return []
    index = parameter_index(func, value.id)
    found = [(call_arg(call, index, value.id), at) for call, at in facts.calls_of(func)]
    return [(arg, at) for arg, at in found if arg is not None]


def _values(facts: ModuleFacts, dataset: ast.expr, scope: Scope) -> list[ast.expr]:
    """The expression, and what its name (or ``self.`` attribute) is bound to."""
    values: list[ast.expr] = [dataset]
    if isinstance(dataset, ast.Name):
        values += [v for v in facts.lookup_all(dataset.id, scope) if v is not None]
    elif (dotted(dataset) or "").startswith("self."):
        values += facts.instance_values(dataset)
        values += [  # `self.train_dataset = train_dataset`, a parameter of the constructor
            v for v in facts.lookup_all(dotted(dataset) or "", scope) if isinstance(v, ast.Name)
        ]
    return values


def _class_shards(facts: ModuleFacts, call: ast.Call) -> bool:
    """A call of a project class whose methods read the rank (not only to test rank 0)."""
    func = call.func
    methods: list[tuple[ModuleFacts, ast.AST]] = []
    if isinstance(func, ast.Name) and func.id not in facts.imports.names:
        cls = facts.toplevel.get(func.id)
        if isinstance(cls, ast.ClassDef):
            methods = [(facts, n) for n in cls.body if isinstance(n, ast.FunctionDef)]
    elif facts.resolver is not None and dotted(func) is not None:
        for name in _METHODS:
            probe = ast.Attribute(value=func, attr=name, ctx=ast.Load())
            methods += facts.resolver.callees(facts, probe)
    return any(_consults_rank(owner, method) for owner, method in methods)


def _local_class_shards(facts: ModuleFacts, call: ast.Call, scope: Scope) -> bool:
    """A call of a class defined in the function building the loader, where that function (or
    a method of its class) consults the rank: the local class reads what they sharded
    (``PackedDataLoader.__init__(self, path, rank, world_size)`` keeps
    ``data[rank * n:(rank + 1) * n]``; its ``_start_workers`` defines a ``Dataset`` drawing
    from ``outer.data``)."""
    func = scope.node
    if not isinstance(call.func, ast.Name) or not isinstance(func, ast.FunctionDef):
        return False
    local = any(isinstance(n, ast.ClassDef) and n.name == call.func.id for n in ast.walk(func))
    if not local:
        return False
    owner = next(
        (c for c in ast.walk(facts.tree) if isinstance(c, ast.ClassDef) and func in c.body), None
    )
    methods = [n for n in owner.body if isinstance(n, ast.FunctionDef)] if owner else [func]
    return any(_consults_rank(facts, method) for method in methods)


def _consults_rank(facts: ModuleFacts, func: ast.AST) -> bool:
    tests: set[int] = set()
    for node in ast.walk(func):
        if _rank_zero_test(node):
            tests.update(id(n) for n in ast.walk(node))
    return any(
        isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Constant))
        and id(node) not in tests
        and _reads_rank(facts, node)
        for node in ast.walk(func)
    )


def _reads_rank(facts: ModuleFacts, node: ast.AST) -> bool:
    """A rank read (``get_rank()``, ``os.environ["RANK"]``, a name ``rank``/``local_rank``/
    ``self.rank_id``); a word that only contains the letters (``ranking``) is not one."""
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _RANK_NAME.search(tail(dotted(node)).lower()) is not None
    return facts.mentions_rank(node)


def _rank_zero_test(node: ast.AST) -> bool:
    """``rank == 0``, ``get_rank() != 0``, ``not rank``: a test of one rank, not a split."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return True
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return sum(not isinstance(s, ast.Constant) for s in sides) <= 1
    return False
