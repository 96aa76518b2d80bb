"""A function of a helper module that only scripts without a process group call.

A project's data module often holds both loaders, ``build_train_loader(cfg)`` with
``shuffle=True`` for the one-process trainer and ``build_train_loader_ddp(cfg)`` with a
``DistributedSampler`` for the distributed one. The ``DistributedSampler`` makes the module look
distributed, but the first function runs only where its callers run: when every caller is in
a linted file that never runs under a process group (and the module itself neither creates
the group nor calls the function), each process that builds that loader is alone, and an
unsharded loader there is right (no ``GT003``). A function nobody in the project calls keeps
its reading: it may be the entry point of a launch the lint does not see.

The same holds for what such a function writes (:func:`entry_or_alone`): ``get_vla(cfg)`` of
a utilities module that the distributed trainers import, called only by the one-process
evaluation and serving scripts, runs in one process, and the config file it rewrites has one
writer. Only where nothing on that path can start the processes: a script with no process
group of its own may still be one of several (``torchrun run.py`` whose ``main`` calls
``train(cfg)``, which builds a ``Fabric``), so the function, its module and every calling
file must import no distributed library (``torch.distributed``, Accelerate, Lightning,
DeepSpeed, ...), and the function must set up no group; or every calling file must be one
the repository only runs as ``python script.py``
(:func:`~gpu_training.diagnostics.lint.plain_launches.launched_alone`).
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.context import ONE_PROCESS, Ctx, entry_context
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope
from gpu_training.diagnostics.lint.plain_launches import launched_alone

__all__ = ["called_only_alone", "entry_or_alone"]


def called_only_alone(facts: ModuleFacts, scope: Scope) -> bool:
    """Whether the function ``scope`` is called, and only from files of the project that run
    without a process group.

    Args:
        facts: The module defining the function.
        scope: The function's scope (a module scope gives False).
    """
    func = scope.node
    resolver = facts.resolver
    if resolver is None or not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    if any(func in facts.local_functions(call) for call in facts.calls):
        return False  # called here: as distributed as this module
    sites = resolver.incoming((facts, func))
    return bool(sites) and not any(resolver.runs_distributed(owner) for owner, _, _ in sites)


def entry_or_alone(
    facts: ModuleFacts, func: ast.FunctionDef | ast.AsyncFunctionDef, sites: list[Ctx]
) -> Ctx:
    """A function's entry context from its call sites' (:func:`~gpu_training.diagnostics.lint.
    context.entry_context`); with no site that runs under a process group, and only plain
    one-process files calling it (see the module's docstring), one process.

    Args:
        facts: The function's module.
        func: The function.
        sites: The contexts of its calls that run under a process group.
    """
    if not sites:
        key = ("called-only-alone", id(func))
        alone = facts.memo.get(key)
        if alone is None:
            alone = called_only_alone(facts, facts.scope_of(func)) and _plain_callers(facts, func)
            facts.memo[key] = alone
        if alone:
            return Ctx(rank0=True, guard=ONE_PROCESS)
    return entry_context(sites, func.name)


_DISTRIBUTED = (
    "torch.distributed",
    "torch.nn.parallel",
    "torch.multiprocessing",
    "accelerate",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "deepspeed",
    "horovod",
)


def _plain_callers(facts: ModuleFacts, func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The function sets up no distributed training, and neither its file nor any file that
    calls it imports a distributed library."""
    resolver = facts.resolver
    assert resolver is not None  # called_only_alone held
    summary = resolver.summary((facts, func))
    if summary.distributed or summary.creates_group or summary.spawns:
        return False  # `train(cfg)` may build the Fabric or the group its callers lack
    callers = {owner.path: owner for owner, _, _ in resolver.incoming((facts, func))}
    if all(launched_alone(owner) for owner in callers.values()):
        return True  # every caller runs as `python script.py`: one process
    return not _imports_distributed(facts) and not any(
        _imports_distributed(owner) for owner in callers.values()
    )


def _imports_distributed(facts: ModuleFacts) -> bool:
    """The module imports a distributed library (:data:`_DISTRIBUTED`)."""
    key = ("imports-distributed", id(facts))
    found = facts.memo.get(key)
    if found is None:
        modules = [a.name for n in facts.nodes if isinstance(n, ast.Import) for a in n.names]
        modules += [n.module or "" for n in facts.nodes if isinstance(n, ast.ImportFrom)]
        found = facts.memo[key] = any(
            m == prefix or m.startswith(prefix + ".") for m in modules for prefix in _DISTRIBUTED
        )
    return bool(found)
