"""A function of a helper module that only scripts without a process group call.

A project's data module often holds both loaders, ``build_train_loader(cfg)`` with
``shuffle=True`` for the one-process trainer and ``build_train_loader_ddp(cfg)`` with a
``DistributedSampler`` for the distributed one. The ``DistributedSampler`` makes the module look
distributed, but the first function runs only where its callers run: when every caller is in
a linted file that never runs under a process group (and the module itself neither creates
the group nor calls the function), each process that builds that loader is alone, and an
unsharded loader there is right (no ``GT003``). A function nobody in the project calls keeps
its reading: it may be the entry point of a launch the lint does not see.
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

__all__ = ["called_only_alone"]


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
