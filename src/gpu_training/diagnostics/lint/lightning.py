"""A Lightning ``Trainer`` that launches the script in every process.

``trainer = L.Trainer(...)`` then ``trainer.fit(...)``: with more than one device (the
default ``devices="auto"`` takes every GPU of the machine) Lightning's default DDP strategy
starts one process per device, each running the script from the top (its subprocess
launcher), so the code after ``fit`` — ``torch.save(model.state_dict(), path)`` — runs on
every rank. The code before ``fit`` runs first in the launching process alone (the others
start inside ``fit``): a file it creates there exists before they run. The file then counts as distributed, and its writes need a rank guard
(``trainer.is_global_zero``, ``@rank_zero_only``). Not so for one device, a CPU run with
the default device count, or a strategy whose children run only ``fit`` (``"ddp_spawn"``,
``"ddp_notebook"``, ``DDPStrategy(start_method="spawn")``), nor ``"dp"`` (one process).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("import lightning as L\\ntrainer = L.Trainer(max_epochs=3)\\n"
    ...        "trainer.fit(model, loader)\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> launch = lightning_launch(facts)
    >>> launch.scopes == {facts.tree}, len(launch.fits)
    (True, 1)
    >>> lightning_launch(ModuleFacts(ast.parse(src.replace("max_epochs=3", "devices=1"))))
    Launch(scopes=frozenset(), fits=frozenset())
"""

from __future__ import annotations

import ast
from typing import NamedTuple

from gpu_training.diagnostics.lint.calls import keyword_arg, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name

__all__ = ["Launch", "calling_statements", "lightning_launch"]

_PACKAGES = ("lightning", "pytorch_lightning")
_ONE_PROCESS_STRATEGIES = ("ddp_spawn", "ddp_notebook", "ddp_fork", "dp", "single_device")


class Launch(NamedTuple):
    """Where Lightning starts the other processes of a file."""

    scopes: frozenset[ast.AST]
    """The scopes (functions, or the module) that build such a ``Trainer``."""
    fits: frozenset[int]
    """The ids of the statements of those scopes that call ``fit``."""


def lightning_launch(facts: ModuleFacts) -> Launch:
    """The scopes that build a Lightning ``Trainer`` over several devices with a strategy
    that re-runs the script in every process, and their statements that call ``fit``.

    The launching process runs the code before ``fit`` alone (the others start inside
    ``fit`` and then run the script from the top); from ``fit`` on, every process runs it.
    """
    fits = [c for c in facts.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "fit"]
    scopes = frozenset(
        facts.scope_containing(c).node
        for c in (facts.calls if fits else [])
        if _is_trainer(facts, c) and _many_processes(facts, c)
    )
    return Launch(scopes, calling_statements(facts, scopes, fits))


def calling_statements(
    facts: ModuleFacts, scopes: frozenset[ast.AST], calls: list[ast.Call]
) -> frozenset[int]:
    """The ids of the statements of ``scopes`` (expression statements and assignments) that
    make one of ``calls``: where a launcher's other processes start (``trainer.fit(...)``,
    ``fabric.launch()``)."""
    return frozenset(
        id(node)
        for scope in scopes
        for node in facts.scope_nodes.get(scope, [])
        if isinstance(node, (ast.Expr, ast.Assign))
        and any(sub is call for sub in ast.walk(node.value) for call in calls)
    )


def _is_trainer(facts: ModuleFacts, call: ast.Call) -> bool:
    name = call_name(call, facts.imports)
    return tail(name) == "Trainer" and name.split(".")[0] in _PACKAGES


def _many_processes(facts: ModuleFacts, trainer: ast.Call) -> bool:
    strategy = keyword_arg(trainer, "strategy")
    if isinstance(strategy, ast.Constant) and isinstance(strategy.value, str):
        if strategy.value.startswith(_ONE_PROCESS_STRATEGIES):
            return False
    elif isinstance(strategy, ast.Call):
        start = keyword_arg(strategy, "start_method")
        if isinstance(start, ast.Constant) and start.value in ("spawn", "fork"):
            return False
    devices = keyword_arg(trainer, "devices") or keyword_arg(trainer, "gpus")
    accelerator = keyword_arg(trainer, "accelerator")
    if devices is None:  # "auto": every GPU of the machine, one process on a CPU
        return not (isinstance(accelerator, ast.Constant) and accelerator.value == "cpu")
    if isinstance(devices, ast.Constant):
        value = devices.value
        if isinstance(value, str):
            value = -1 if value.strip() in ("auto", "-1") else len(value.split(","))
        return isinstance(value, int) and (value == -1 or value > 1)
    if isinstance(devices, (ast.List, ast.Tuple)):
        return len(devices.elts) > 1
    return True  # `devices=torch.cuda.device_count()`, `devices=args.gpus`: set at launch
