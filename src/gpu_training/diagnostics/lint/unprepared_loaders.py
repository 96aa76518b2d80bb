"""A training loader of an Accelerate or Fabric script that never reaches ``prepare`` (``GT003``).

Accelerate shards a ``DataLoader`` only when the loader itself goes through
``accelerator.prepare(...)``: it re-builds it over a sampler (or a batch sampler) split by
process. Fabric likewise in ``fabric.setup_dataloaders(...)``. ``GT003``'s ordinary check
leaves such scripts to the framework. But a loader the script never hands over (the
``prepare`` line commented out), or hands over only after wrapping it in something that is no
longer a ``DataLoader`` (``train_dl = cycle(train_dl)``, a generator, then ``prepare(train_dl)``,
which passes it through untouched), is read as built: every process draws the same batches
from the same ``RandomSampler``.

Read in the function that builds the loader, bound to a plain name: the loader reaches
preparation when a ``prepare*``/``setup_dataloader*`` call is given the name while the name
still holds it. A call of anything else that is given the loader (a trainer class of a library,
a helper of the project that prepares it) may prepare it out of sight, so the loader is left
alone, except for the project's own functions that prepare nothing (``cycle(loader)``) and the
builtins that only read it (``iter``, ``next``, ``len``, ``enumerate``). Evaluation loaders,
loaders built with ``**kwargs``, with a distributed sampler, or over a dataset that splits
itself are not reported, as by the ordinary check.

Fabric's ``setup_dataloaders`` shards by replacing the loader's sampler; an ``IterableDataset``
has none, so a loader over a project class deriving from ``IterableDataset`` whose methods
never consult the rank (:func:`unsplit_iterable_loaders`) streams the whole dataset to every
process, set up or not. (Accelerate's ``prepare`` dispatches such a loader's batches across
the processes, so it is not reported there.)

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("from torch.utils.data import DataLoader\\n"
    ...        "def main(acc, model, opt, ds):\\n"
    ...        "    train_dl = DataLoader(ds, batch_size=8, shuffle=True)\\n"
    ...        "    model, opt = acc.prepare(model, opt)\\n"
    ...        "    for x in train_dl:\\n"
    ...        "        acc.backward(model(x))\\n"
    ...        "        opt.step()\\n"
    ...        "main(a, m, o, d)\\n")
    >>> [(call.lineno, detail) for call, detail in unprepared_loaders(ModuleFacts(ast.parse(src)))]
    [(3, 'the loader never reaches prepare()/setup_dataloaders()')]
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import call_arg, node_start, tail
from gpu_training.diagnostics.lint.loaders import own_loader_class, project_classes
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.sharded_datasets import dataset_shards_itself

__all__ = ["unprepared_loaders", "unsplit_iterable_loaders"]

_PREPARES = ("prepare", "setup_dataloader")
"""The methods that shard a loader: ``accelerator.prepare*``, ``fabric.setup_dataloaders``."""
_READS = frozenset({"iter", "next", "len", "enumerate", "zip", "print", "list"})
"""Builtins that only read (or draw from) a loader."""
_EVAL = ("val", "eval", "test", "dev")


def unprepared_loaders(facts: ModuleFacts) -> list[tuple[ast.Call, str]]:
    """The training ``DataLoader(...)`` calls of a framework script that no ``prepare`` shards.

    Args:
        facts: The file's facts (a file whose framework is Accelerate or Fabric).

    Returns:
        ``(DataLoader call, evidence)`` for each loader left unsharded.
    """
    found: list[tuple[ast.Call, str]] = []
    for func, nodes in facts.scope_nodes.items():
        scope = facts.scopes.get(func)
        if scope is None:
            continue
        for node in nodes:
            if not (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call)
                and tail(call_name(node.value, facts.imports)) == "DataLoader"
                and not own_loader_class(facts, node.value)
            ):
                continue
            call, name = node.value, node.targets[0].id
            if not _unsharded(facts, call, scope, name):
                continue
            if _may_be_prepared(facts, call, scope, name):
                continue
            if _drawn_in_training(facts, [scope], name):
                found.append((call, "the loader never reaches prepare()/setup_dataloaders()"))
    return found


def unsplit_iterable_loaders(facts: ModuleFacts) -> list[tuple[ast.Call, str]]:
    """The training ``DataLoader(...)`` calls of a Fabric script (or a distributed one with
    no framework) over an ``IterableDataset`` of the project that never splits itself by
    rank: ``setup_dataloaders`` has no sampler to replace in such a loader, and a plain
    script none to give it, so every process iterates the whole stream.

    Args:
        facts: The file's facts (Fabric's, or a distributed script's without a framework).

    Returns:
        ``(DataLoader call, evidence)`` for each such loader read by a training loop.
    """
    found: list[tuple[ast.Call, str]] = []
    for node in facts.nodes:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.value, ast.Call)
            and tail(call_name(node.value, facts.imports)) == "DataLoader"
            and not own_loader_class(facts, node.value)
        ):
            continue
        call, key = node.value, dotted(node.targets[0])
        dataset = call_arg(call, 0, "dataset")
        if key is None or dataset is None or _evaluates(key, dotted(dataset)):
            continue
        scope = facts.scope_containing(call)
        if dataset_shards_itself(facts, dataset, scope):
            continue
        stream = next(
            filter(None, (_iterable_class(facts, v) for v in _bound(facts, dataset, scope))), None
        )
        scopes = list(facts.scopes.values()) if key.startswith("self.") else [scope]
        if stream is not None and _drawn_in_training(facts, scopes, key):
            found.append((call, f"{stream} is an IterableDataset that never splits by rank"))
    return found


def _evaluates(*names: str | None) -> bool:
    """A name that says validation/evaluation/test."""
    return any(n is not None and any(e in tail(n).lower() for e in _EVAL) for n in names)


def _bound(facts: ModuleFacts, dataset: ast.expr, scope: Scope) -> list[ast.expr]:
    """The dataset expression and the calls its name (or ``self.`` attribute) is bound to."""
    if isinstance(dataset, ast.Name):
        return [dataset, *(v for v in facts.lookup_all(dataset.id, scope) if v is not None)]
    if (dotted(dataset) or "").startswith("self."):
        return [dataset, *facts.instance_values(dataset)]
    return [dataset]


def _iterable_class(facts: ModuleFacts, value: ast.expr) -> str | None:
    """The name of the project's ``IterableDataset`` subclass ``value`` constructs."""
    if not isinstance(value, ast.Call):
        return None
    classes = project_classes(facts, value)
    for cls in classes:
        if any(tail(dotted(b)) == "IterableDataset" for b in cls.bases):
            return cls.name
    return None


def _unsharded(facts: ModuleFacts, call: ast.Call, scope: Scope, name: str) -> bool:
    """A training loader with no sampler, or a local one, over a dataset that does not split
    itself."""
    if any(k.arg is None for k in call.keywords) or any(
        isinstance(a, ast.Starred) for a in call.args
    ):
        return False
    dataset = call_arg(call, 0, "dataset")
    if _evaluates(name, dotted(dataset) if dataset is not None else None):
        return False
    given = [
        s
        for s in (call_arg(call, 3, "sampler"), call_arg(call, 4, "batch_sampler"))
        if s is not None and not (isinstance(s, ast.Constant) and s.value is None)
    ]
    if given:
        kinds = frozenset().union(*(_sampler_kinds(facts, s, scope) for s in given))
        return "local_sampler" in kinds and "dist_sampler" not in kinds
    if dataset is None or "iterable" in ast.unparse(dataset).lower():
        return False
    return not dataset_shards_itself(facts, dataset, scope)


def _sampler_kinds(facts: ModuleFacts, expr: ast.expr, scope: Scope) -> frozenset[str]:
    """The sampler's kinds, through ``BatchSampler(sampler, ...)`` (it batches what it is
    given) and the names it is bound to on every path."""
    values: list[ast.expr] = [expr]
    key = dotted(expr)
    if key is not None and isinstance(expr, ast.Name):
        values = [v for v in facts.lookup_all(key, scope) if v is not None] or [expr]
    found: frozenset[str] = frozenset()
    for value in values:
        if isinstance(value, ast.Call) and tail(call_name(value, facts.imports)) == "BatchSampler":
            inner = call_arg(value, 0, "sampler")
            found |= _sampler_kinds(facts, inner, scope) if inner is not None else frozenset()
        else:
            found |= facts.kinds(value, scope) or frozenset({"unknown"})
    return found


def _may_be_prepared(facts: ModuleFacts, loader: ast.Call, scope: Scope, name: str) -> bool:
    """The loader reaches a ``prepare`` call while ``name`` holds it, or reaches a call that
    may prepare it out of sight."""
    nodes = facts.scope_nodes.get(scope.node, [])
    looped = {id(n.iter) for n in nodes if isinstance(n, (ast.For, ast.AsyncFor))}
    for node in nodes:
        if not isinstance(node, ast.Call) or node is loader or id(node) in looped:
            continue  # `for batch in tqdm(loader)`: the loop draws the batches
        given = [
            n
            for arg in [*node.args, *(k.value for k in node.keywords)]
            for n in ast.walk(arg)
            if isinstance(n, ast.Name) and n.id == name
        ]
        if not given:
            continue
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if method is not None and method.startswith(_PREPARES):
            if any(_holds(facts, nodes, loader, name, n) for n in given):
                return True
            continue
        called = dotted(node.func)
        if called in _READS and called not in facts.imports.names:
            continue
        refs = facts.callees(node)
        if not refs or any(_prepares(owner, func) for owner, func in refs):
            return True
    return False


def _holds(
    facts: ModuleFacts, nodes: list[ast.AST], loader: ast.Call, name: str, read: ast.Name
) -> bool:
    """``name`` may still hold the loader where it is read: bound to it before, and not bound
    since to anything but another ``DataLoader`` (``dl = cycle(dl)`` is a generator; the
    ``else:`` of an ``if`` that builds another loader is not)."""
    start, at = node_start(loader), node_start(read)
    if not start < at:
        return False
    for node in nodes:
        if not isinstance(node, ast.Assign):
            continue
        end = (node.end_lineno or 0, node.end_col_offset or 0)
        if not start < node_start(node.value) or not end <= at:
            continue  # outside the stretch, or the assignment this read is part of
        if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            made = tail(call_name(value, facts.imports)) if isinstance(value, ast.Call) else ""
            if made != "DataLoader":
                return False
    return True


def _drawn_in_training(facts: ModuleFacts, scopes: list[Scope], key: str) -> bool:
    """A loop of the scopes reads the loader (or what a call made of it: ``cycle(loader)``,
    ``tqdm(self.loader)``) and runs a training step: positive evidence that training draws
    its batches."""
    for scope in scopes:
        nodes = facts.scope_nodes.get(scope.node, [])
        keys = {key}
        for _ in range(2):  # `dl = cycle(dl)`, `bar = tqdm(self.loader)`
            keys |= {
                k
                for n in nodes
                if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Call)
                and any(dotted(a) in keys for a in n.value.args)
                for k in map(dotted, n.targets)
                if k is not None
            }
        for loop in nodes:
            if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
                continue
            inside = [n for n in ast.walk(loop) if n is not loop]
            reads = any(
                isinstance(n, (ast.Name, ast.Attribute)) and dotted(n) in keys for n in inside
            )
            if reads and any(isinstance(n, ast.Call) and _steps(facts, n) for n in inside):
                return True
    return False


def _steps(facts: ModuleFacts, call: ast.Call) -> bool:
    """A training step: ``backward()``, ``zero_grad()``, ``optimizer.step()``, or a function of
    the project that runs one."""
    func = call.func
    if isinstance(func, ast.Attribute):
        receiver = tail(dotted(func.value)).lower()
        if func.attr in ("backward", "zero_grad") or (func.attr == "step" and "optim" in receiver):
            return True
    return any(s.trains for s in facts.summaries(call))


def _prepares(owner: ModuleFacts, func: ast.AST) -> bool:
    """A function of the project that calls a ``prepare*``/``setup_dataloader*`` method."""
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr.startswith(_PREPARES)
        for n in owner.scope_nodes.get(func, [])
    )
