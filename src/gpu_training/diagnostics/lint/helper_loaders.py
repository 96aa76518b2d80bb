"""A project function that returns a ``DataLoader`` without a sampler (``GT003`` one hop).

``GT003`` reads a ``DataLoader`` where a distributed script builds it. Often a helper
module builds it (``data_loader = create_dataloader(path, tokenizer, ...)``) and knows
nothing of the process group: reported there, a utilities package's every loader would be
flagged. The helper's summary records instead that it returns a loader built with no
``sampler=``/``batch_sampler=`` (or one bound to ``None`` only) over a dataset that does not
shard itself (:mod:`~gpu_training.diagnostics.lint.sharded_datasets`), and builds no distributed
sampler, and the distributed script that calls it is told, at the call, when the result
reaches a training step. A loader built from ``**kwargs`` is not judged.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("def make(ds, bs):\\n    sampler = None\\n"
    ...        "    dl = DataLoader(ds, batch_size=bs, sampler=sampler)\\n    return dl\\n")
    >>> tree = ast.parse(src)
    >>> facts = ModuleFacts(tree)
    >>> returns_unsharded_loader(facts, tree.body[0])
    True
"""

from __future__ import annotations

import ast
import re

from gpu_training.diagnostics.lint.calls import call_arg, is_const, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.sharded_datasets import dataset_shards_itself

__all__ = ["always_none", "returns_unsharded_loader"]

_GROUP_WORDS = re.compile(r"rank|world_size|num_replicas|distributed|shard", re.I)
_SHARDING = frozenset({"DistributedSampler", "make_distributed_sampler", "GlobalBatchSampler"})


def returns_unsharded_loader(facts: ModuleFacts, func: ast.AST) -> bool:
    """Whether a function returns a ``DataLoader`` it builds with no sampler at all.

    Args:
        facts: The module's facts.
        func: The function (anything else: False).

    Returns:
        True when a ``return`` gives back (directly, or through the name it is bound to) a
        ``DataLoader(...)`` with no sampler, no ``**kwargs``, and the function builds no
        distributed sampler.
    """
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    scope = facts.scope_of(func)
    nodes = facts.scope_nodes.get(func, [])
    calls = [n for n in nodes if isinstance(n, ast.Call)]
    if any(tail(call_name(c, facts.imports)) in _SHARDING or _shares_out(facts, c) for c in calls):
        return False
    loaders = [c for c in calls if tail(call_name(c, facts.imports)) == "DataLoader"]
    returns = [
        value
        for node in nodes
        if isinstance(node, ast.Return) and node.value is not None
        for value in (node.value.elts if isinstance(node.value, ast.Tuple) else [node.value])
    ]
    ids, names = {id(v) for v in returns}, {v.id for v in returns if isinstance(v, ast.Name)}
    return any(
        (id(loader) in ids or _bound_name(nodes, loader) in names)
        and _unsharded(facts, loader, scope)
        for loader in loaders
    )


def _shares_out(facts: ModuleFacts, call: ast.Call) -> bool:
    """A call other than the loader told which rank or how many (``Wrapper(ds, rank=rank,
    world_size=world_size)``): the data is sharded there, a sampler is not needed."""
    if tail(call_name(call, facts.imports)) == "DataLoader":
        return False
    for keyword in call.keywords:
        if keyword.arg is not None and _GROUP_WORDS.search(keyword.arg):
            return True
    values = [*call.args, *(k.value for k in call.keywords)]
    return any(facts.mentions_rank(v) or _GROUP_WORDS.search(tail(dotted(v)) or "") for v in values)


def _bound_name(nodes: list[ast.AST], call: ast.Call) -> str | None:
    for node in nodes:
        if isinstance(node, ast.Assign) and node.value is call and len(node.targets) == 1:
            return dotted(node.targets[0])
    return None


def _unsharded(facts: ModuleFacts, loader: ast.Call, scope: Scope) -> bool:
    """No sampler reaches the loader: none given, or ``None`` on every binding."""
    if any(k.arg is None for k in loader.keywords) or any(
        isinstance(a, ast.Starred) for a in loader.args
    ):
        return False
    samplers = (call_arg(loader, 3, "sampler"), call_arg(loader, 4, "batch_sampler"))
    if not all(value is None or always_none(facts, value, scope) for value in samplers):
        return False
    dataset = call_arg(loader, 0, "dataset")  # a dataset that splits itself by rank
    return dataset is None or not dataset_shards_itself(facts, dataset, scope)


def always_none(facts: ModuleFacts, value: ast.expr, scope: Scope) -> bool:
    """``None``, or a name every binding of which is ``None`` (``sampler = None``)."""
    if is_const(value, None):
        return True
    bound = facts.lookup_all(value.id, scope) if isinstance(value, ast.Name) else []
    return bool(bound) and all(is_const(v, None) for v in bound)
