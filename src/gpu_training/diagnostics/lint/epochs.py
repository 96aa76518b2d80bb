"""Epoch loops and the sampler's ``set_epoch`` (``GT005``).

A shuffling ``DistributedSampler`` draws the same order every epoch unless ``set_epoch`` is
called. An epoch loop is a loop around a loop over a loader, or one that hands a loader on
to a function of the project that trains over it (``train_one_epoch(model, loader)``,
``self.train_epoch(self.model, self.train_loader, ...)``, ``self._run_epoch(epoch)``); the
sampler may be built in the same file or in a file of the project that imports this one
(``main.py`` builds it, ``trainer.py`` loops).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> facts = ModuleFacts(ast.parse("for x in tqdm(train_loader):\\n    pass\\n"))
    >>> iterates_loader(facts.tree.body[0].iter, facts.module_scope, facts)
    True
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence

from gpu_training.diagnostics.lint.calls import call_arg, is_const, tail
from gpu_training.diagnostics.lint.library_loaders import (
    prefetched_loader,
    shuffling_library_loader,
)
from gpu_training.diagnostics.lint.loaders import trains_on_argument
from gpu_training.diagnostics.lint.model import (
    Imports,
    ModuleFacts,
    Scope,
    call_name,
    dotted,
    iter_scope_nodes,
)
from gpu_training.diagnostics.lint.sampler_classes import sampler_shuffle_index
from gpu_training.diagnostics.lint.setup import EVAL_NAME
from gpu_training.diagnostics.lint.summary import Summary

__all__ = [
    "hands_loader_on",
    "iterates_loader",
    "loop_trains",
    "loops_without_set_epoch",
    "prepared_by_accelerate",
    "shuffling_sampler",
    "unset_shuffling_sampler",
]

_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip", "islice"})
_SAMPLERS = frozenset({"DistributedSampler", "make_distributed_sampler", "GlobalBatchSampler"})


def hands_loader_on(
    facts: ModuleFacts, loop: ast.For | ast.AsyncFor | ast.While, scope: Scope
) -> bool:
    """A loop whose body passes a data loader to a function of the project that iterates
    it and calls no ``set_epoch`` itself (an epoch loop around ``train(model, loader)``),
    or calls a method that trains over its object's loader (``self._run_epoch(epoch)``).
    A function nobody here can read (an installed package's, ``list.append``) is not
    one: what it does is unknown. A loader the loop binds itself (``for task, loader in
    loaders.items(): train_task(task, loader)``) is a new one each pass: a loop over tasks,
    not epochs of one loader."""
    own = _bound_by(loop)
    for node in ast.walk(ast.Module(body=loop.body, type_ignores=[])):
        if not isinstance(node, ast.Call):
            continue
        refs = facts.callees(node)
        if not refs or _per_pass_loader(facts, node, own, scope):
            continue
        hands = any(
            isinstance(arg, (ast.Name, ast.Attribute))
            and not (isinstance(arg, ast.Name) and arg.id in own)
            and not EVAL_NAME.search(tail(dotted(arg)))  # `validate(model, val_loader)`
            and "loader" in facts.kinds(arg, scope)
            for arg in [*node.args, *(k.value for k in node.keywords)]
        )
        # `for epoch ...: self._run_epoch(epoch)`, the method iterating `self.train_data`
        hands = hands or any(_iterates_own_loader(owner, func) for owner, func in refs)
        hands = hands or any(trains_on_argument(o, f, node) for o, f in refs)  # its batches
        if hands and not any(_calls_set_epoch(func) for _, func in refs):
            return True
    return False


def _per_pass_loader(facts: ModuleFacts, call: ast.Call, own: set[str], scope: Scope) -> bool:
    """The call is handed a loader the loop binds anew on each pass."""
    return any(
        isinstance(arg, ast.Name)
        and arg.id in own
        and ("loader" in facts.kinds(arg, scope) or "loader" in arg.id.lower())
        for arg in [*call.args, *(k.value for k in call.keywords)]
    )


def _bound_by(loop: ast.For | ast.AsyncFor | ast.While) -> set[str]:
    """The names a ``for`` loop's target binds (none for ``while``)."""
    target = getattr(loop, "target", None)
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} if target else set()


def iterates_loader(expr: ast.expr, scope: Scope, facts: ModuleFacts) -> bool:
    """Whether a ``for`` loop's iterable is a data loader (through ``enumerate``, ``tqdm``…,
    and a name bound to one of those: ``pbar = tqdm(loader)``), or counts its batches
    (``for _ in range(len(loader)): batch = next(it)``: one pass over the loader)."""
    expr = _loop_source(expr)
    counted = _counted(expr)
    if counted is not None:
        return iterates_loader(counted, scope, facts)
    if "loader" in facts.kinds(expr, scope) or "loader" in tail(dotted(expr)).lower():
        return True
    wrapped = _wrapped_source(expr, scope, facts)
    return wrapped is not None and iterates_loader(wrapped, scope, facts)


def unset_shuffling_sampler(
    calls: list[ast.Call],
    tails: set[str],
    imports: Imports,
    summaries: Sequence[Summary] = (),
    toplevel: Mapping[str, ast.stmt] | None = None,
) -> bool:
    """A distributed sampler of the file, or of a function of the project it calls (a
    ``get_train_loader()`` in ``data/``), shuffles, and nothing calls ``set_epoch`` (nor the
    toolkit's ``train_one_epoch``), in the file or in those functions: what a file hands
    on to the modules it imports, whose epoch loops (``Trainer.__call__`` in ``train.py``)
    may run over its loader."""
    shuffled = any(shuffling_sampler(call, imports, toplevel) for call in calls)
    shuffled = shuffled or any(s.shuffles_sampler for s in summaries)
    unset = not tails & {"set_epoch", "train_one_epoch"}
    return shuffled and unset and not any(s.sets_epoch for s in summaries)


def shuffling_sampler(
    call: ast.Call, imports: Imports, toplevel: Mapping[str, ast.stmt] | None = None
) -> bool:
    """``DistributedSampler(dataset)`` (``shuffle`` not ``False``) or the toolkit's own, or a
    class of the module (``toplevel``) derived from it (:mod:`.sampler_classes`)."""
    if shuffling_library_loader(call, imports):  # timm's create_loader(distributed=...)
        return True
    last = tail(call_name(call, imports))
    own = None
    if toplevel and isinstance(call.func, ast.Name) and call.func.id not in imports.names:
        own = sampler_shuffle_index(toplevel, call.func.id, {"DistributedSampler"}, imports.resolve)
    if own is None and last not in _SAMPLERS:
        return False
    index = (
        own
        if own is not None
        else {"DistributedSampler": 3, "make_distributed_sampler": 2}.get(last, 99)
    )
    return not is_const(call_arg(call, index, "shuffle"), False)


def loops_without_set_epoch(
    epoch_loops: list[ast.stmt],
    calls: list[ast.Call],
    tails: set[str],
    facts: ModuleFacts,
    *,
    imported: bool = False,
) -> list[ast.stmt]:
    """``GT005``: the epoch loops to report when a shuffling sampler never gets ``set_epoch``.

    Args:
        epoch_loops: The loops around a loop over a loader, in walk order (repeats allowed).
        calls: Every call of the file.
        tails: The last names of every callee of the file.
        facts: The file's facts.
        imported: A file of the project that imports this one builds a shuffling
            distributed sampler and never sets its epoch (:func:`unset_shuffling_sampler`):
            this file's epoch loops that train are reported.

    Returns:
        The epoch loops, once each, when a distributed sampler (of the file, or of a file
        importing it) shuffles and neither ``set_epoch`` nor ``train_one_epoch`` is called
        in the file; else nothing.
    """
    epoch_loops = [loop for loop in epoch_loops if not _runs_once(loop)]  # `range(1)`
    if unset_shuffling_sampler(calls, tails, facts.imports, toplevel=facts.toplevel):
        return list(dict.fromkeys(epoch_loops))
    if imported and not tails & {"set_epoch", "train_one_epoch"}:
        # the sampler is another file's: only loops that train here can be reading it
        kept = [
            loop
            for loop in dict.fromkeys(epoch_loops)
            if loop_trains(facts, loop) or _passes_over_project_loader(facts, loop)
        ]
        inner = {id(n) for loop in kept for n in ast.walk(loop) if n is not loop}
        return [loop for loop in kept if id(loop) not in inner]  # the batch loop inside: one
    if not tails & {"set_epoch", "train_one_epoch"}:
        return [loop for loop in dict.fromkeys(epoch_loops) if _reads_object_loader(facts, loop)]
    return []


def _runs_once(loop: ast.stmt) -> bool:
    """``for epoch in range(1):`` (or ``range(0, 1)``): one epoch, whose order the sampler
    draws from its seed alone, so there is no next epoch for ``set_epoch`` to reshuffle."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.iter, ast.Call):
        return False
    call = loop.iter
    bounds = [
        a.value
        for a in call.args
        if isinstance(a, ast.Constant)
        and isinstance(a.value, int)
        and not isinstance(a.value, bool)
    ]
    if dotted(call.func) != "range" or call.keywords or len(bounds) != len(call.args):
        return False
    if not 1 <= len(bounds) <= 2:
        return False
    start, stop = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
    return stop - start <= 1


def _reads_object_loader(facts: ModuleFacts, loop: ast.stmt) -> bool:
    """An epoch loop whose batch loop passes over a loader held by an object of a project
    class (``data = Data(cfg)`` ... ``for _ in range(len(data.train_loader))``) whose methods
    build a shuffling distributed sampler and never set its epoch: the loader the class
    keeps (``self.train_loader = DataLoader(..., sampler=...)``) is that sampler's."""
    scope = facts.scope_containing(loop)
    for inner in iter_scope_nodes(getattr(loop, "body", [])):
        if not isinstance(inner, (ast.For, ast.AsyncFor)):
            continue
        source = _loop_source(inner.iter)
        source = _counted(source) or source
        if not isinstance(source, ast.Attribute) or EVAL_NAME.search(source.attr):
            continue
        if not isinstance(source.value, ast.Name):
            continue
        for value in facts.lookup_all(source.value.id, scope):
            if not isinstance(value, ast.Call):
                continue
            for module, func in facts.callees(value):
                cls = module.scope_of(func).cls
                if func.name != "__init__" or cls is None or module.resolver is None:
                    continue
                methods = [
                    m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                ]
                summaries = [module.resolver.summary((module, m)) for m in methods]
                if any(s.shuffles_sampler for s in summaries) and not any(
                    s.sets_epoch for s in summaries
                ):
                    return True
    return False


def _passes_over_project_loader(facts: ModuleFacts, loop: ast.stmt) -> bool:
    """An epoch loop (not itself a pass over a loader) whose body iterates a loader built
    here by a function of the project that makes a shuffling distributed sampler
    (``train_loader = data.create_dataloader(...)``; ``for batch in train_loader:``): the
    loop reads that sampler whatever the step it runs (a model object's method)."""
    scope = facts.scope_containing(loop)
    if isinstance(loop, (ast.For, ast.AsyncFor)) and iterates_loader(loop.iter, scope, facts):
        return False
    for inner in iter_scope_nodes(getattr(loop, "body", [])):
        if not isinstance(inner, (ast.For, ast.AsyncFor)):
            continue
        source = _loop_source(inner.iter)
        if not isinstance(source, ast.Name) or EVAL_NAME.search(source.id):
            continue
        if any(
            isinstance(value, ast.Call) and any(s.shuffles_sampler for s in facts.summaries(value))
            for value in facts.lookup_all(source.id, scope)
        ):
            return True
    return False


def loop_trains(facts: ModuleFacts, loop: ast.stmt) -> bool:
    """A loop that runs a backward, itself or through a function of the project it calls."""
    return any(
        isinstance(node, ast.Call)
        and (_is_backward(node) or any(s.trains for s in facts.summaries(node)))
        for node in iter_scope_nodes(getattr(loop, "body", []))
    )


def _iterates_own_loader(facts: ModuleFacts, func: ast.AST) -> bool:
    """A method of the project (not an evaluation) whose own loop runs over something its
    object holds (``for x, y in self.train_data:``) that is a loader or that it trains on
    (the loop backpropagates): one epoch of training per call."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or EVAL_NAME.search(func.name):
        return False
    scope = facts.scopes.get(func)
    return scope is not None and any(
        isinstance(node, (ast.For, ast.AsyncFor))
        and (dotted(_held_source(node.iter, scope, facts)) or "").startswith("self.")
        and not EVAL_NAME.search(tail(dotted(_held_source(node.iter, scope, facts))))
        and (iterates_loader(node.iter, scope, facts) or loop_trains(facts, node))
        for node in iter_scope_nodes(func.body)
    )


def _held_source(expr: ast.expr, scope: Scope, facts: ModuleFacts) -> ast.expr:
    """What a ``for`` iterates, also through a local name bound once to a wrapper of it
    (``bar = tqdm(self.train_loader)``; ``for i, batch in enumerate(bar):``)."""
    expr = _loop_source(expr)
    for _ in range(3):
        wrapped = _wrapped_source(expr, scope, facts)
        if wrapped is None:
            break
        expr = wrapped
    return expr


def _wrapped_source(expr: ast.expr, scope: Scope, facts: ModuleFacts) -> ast.expr | None:
    """``loader`` for a name last bound to ``tqdm(loader)`` (or ``enumerate``…), else None."""
    if not isinstance(expr, ast.Name):
        return None
    values = facts.lookup(expr.id, scope, (expr.lineno, expr.col_offset))
    value = values[0] if len(values) == 1 else None
    if not (isinstance(value, ast.Call) and value.args and tail(dotted(value.func)) in _WRAPPERS):
        return None
    return _loop_source(value)


def _counted(expr: ast.expr) -> ast.expr | None:
    """``X`` of ``range(len(X))``."""
    if (
        isinstance(expr, ast.Call)
        and dotted(expr.func) == "range"
        and len(expr.args) == 1
        and isinstance(expr.args[0], ast.Call)
        and dotted(expr.args[0].func) == "len"
        and len(expr.args[0].args) == 1
    ):
        return expr.args[0].args[0]
    return None


def _loop_source(expr: ast.expr) -> ast.expr:
    """What a ``for`` iterates, through ``enumerate``/``tqdm``/``iter``/``zip``/``islice``."""
    while isinstance(expr, ast.Call) and expr.args and tail(dotted(expr.func)) in _WRAPPERS:
        expr = expr.args[0]
    return expr


def _calls_set_epoch(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The function sets the sampler's epoch itself (``sampler.set_epoch(epoch)``), or hands
    the work on to the toolkit's ``train_one_epoch``, which does."""
    return any(
        isinstance(node, ast.Call) and tail(dotted(node.func)) in ("set_epoch", "train_one_epoch")
        for node in ast.walk(func)
    )


def _is_backward(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (node.func.attr == "backward")
    )


def prepared_by_accelerate(facts: ModuleFacts, calls: list[ast.Call]) -> bool:
    """A loader of the file is handed to an ``Accelerator``'s ``prepare()``
    (``model, opt, loader = accelerator.prepare(model, opt, loader)``): the prepared loader
    sets its sampler's epoch itself each time it is iterated (``GT005`` has nothing to say).
    """
    scope = facts.module_scope
    for call in calls:
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr == "prepare"):
            continue
        made = facts.instance_values(func.value)
        if not any((dotted(v.func) or "").rsplit(".", 1)[-1] == "Accelerator" for v in made):
            continue
        for arg in call.args:
            name = dotted(arg) or ""
            if _prefetched(facts, arg):
                continue  # not a DataLoader: prepare() hands it back as it is
            if "loader" in name.rsplit(".", 1)[-1].lower() or "loader" in facts.kinds(arg, scope):
                return True
    return False


def _prefetched(facts: ModuleFacts, arg: ast.expr) -> bool:
    """A name bound (where it is prepared) to a library loader that is no ``DataLoader``
    (:func:`~gpu_training.diagnostics.lint.library_loaders.prefetched_loader`)."""
    key = dotted(arg)
    if key is None:
        return False
    values = facts.lookup(key, facts.scope_containing(arg), (arg.lineno, arg.col_offset))
    return bool(values) and all(
        isinstance(v, ast.Call) and prefetched_loader(v, facts.imports) for v in values
    )
