"""Which launcher framework a file trains with: Accelerate or Fabric, made in the file or by a
helper of the project.

``Accelerator(...)`` (or ``PartialState()``) and ``Fabric(...)`` name the framework where the
file builds them. A project often builds its ``Accelerator`` in a helper of another module
(``accelerator = init_accelerator(args)`` with ``def init_accelerator(args): return
Accelerator(gradient_accumulation_steps=...)``); the object the training loop calls
``prepare``/``backward`` on is the same, and so are its rules (``GT013``: a backward outside
``accelerator.accumulate()`` all-reduces on every micro-batch). The helper is read through its
summary: the kinds of what it returns. When neither can be read (a helper in a module that
does not parse), an attribute or argument annotated with the framework's class (``self.fabric:
Fabric | None = None``, ``def step(accelerator: Accelerator)``) names it: the object the file
calls ``setup``/``backward`` on is that framework's.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> file_framework({"Accelerator", "prepare"}, ModuleFacts(ast.parse("a = Accelerator()")))
    'accelerate'
    >>> file_framework({"init_accelerator"}, ModuleFacts(ast.parse("a = init_accelerator()")))
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpu_training.diagnostics.lint.calls import keyword_arg, tail
from gpu_training.diagnostics.lint.lightning import Launch, calling_statements
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted

__all__ = ["fabric_launch", "file_framework", "one_process_fabric"]

_FRAMEWORKS = {"Accelerator": "accelerate", "PartialState": "accelerate", "Fabric": "fabric"}
_RETURNED = {"accelerator": "accelerate", "fabric": "fabric"}
"""The kinds a project helper may return, by framework."""


def file_framework(tails: set[str], facts: ModuleFacts) -> str | None:
    """``"accelerate"``/``"fabric"`` when the file builds that framework's object, or calls a
    helper of the project that returns one; ``None`` otherwise.

    Args:
        tails: The last names of the file's calls.
        facts: The file's facts (its calls' project helpers).
    """
    found = next((_FRAMEWORKS[t] for t in sorted(tails) if t in _FRAMEWORKS), None)
    if found is not None:
        return found
    for call in _bound_calls(facts):
        for summary in facts.summaries(call):
            for kind in sorted(summary.returns & _RETURNED.keys()):
                return _RETURNED[kind]
    return _annotated(facts)


def _bound_calls(facts: ModuleFacts) -> Iterator[ast.Call]:
    """The calls whose result the file keeps or hands on (``accelerator = make_accelerator()``,
    ``with helper() as fabric:``, ``train(make_accelerator(), model)``): only such an object
    can be the file's framework, and asking every other call what its helper returns
    summarised most of a large project's functions."""
    for node in facts.nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
            values = [node.value]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            values = [node.context_expr]
        elif isinstance(node, ast.Call):
            values = [*node.args, *(k.value for k in node.keywords)]
        else:
            continue
        yield from (v for v in values if isinstance(v, ast.Call))


_FRAMEWORK_MODULES = ("accelerate", "lightning_fabric", "lightning.fabric", "lightning")


def _annotated(facts: ModuleFacts) -> str | None:
    """The framework whose class annotates an attribute or an argument of the file."""
    for node in facts.nodes:
        if isinstance(node, ast.AnnAssign):
            annotation: ast.expr | None = node.annotation
        elif isinstance(node, ast.arg):
            annotation = node.annotation
        else:
            continue
        for part in ast.walk(annotation) if annotation is not None else ():
            name = facts.imports.resolve(dotted(part)) or ""
            last = name.rsplit(".", 1)[-1]
            if last in _FRAMEWORKS and name.startswith(_FRAMEWORK_MODULES):
                return _FRAMEWORKS[last]
    return None


_FABRIC_START = frozenset(
    {"launch", "setup", "setup_module", "setup_dataloaders", "setup_optimizers"}
)
"""Fabric's methods that start the processes or join the group (its constructor does neither)."""


def one_process_fabric(facts: ModuleFacts, tails: set[str]) -> bool:
    """The file's Fabric starts no other process and no group: it is never launched nor set
    up (the file only borrows Fabric's loggers or precision plugin), or every ``Fabric(...)``
    it builds asks for one device on one node (``L.Fabric(accelerator="cuda", devices=1)``).

    Args:
        facts: The file's facts.
        tails: The last names of its calls.
    """
    if not tails & _FABRIC_START:
        return True
    made = [c for c in facts.calls if (dotted(c.func) or "").rsplit(".", 1)[-1] == "Fabric"]
    if not made:
        return False
    for call in made:
        given = {k.arg: k.value for k in call.keywords}
        if None in given:  # `Fabric(**config)`: the devices are not read here
            return False
        devices, nodes = given.get("devices"), given.get("num_nodes")
        if not (isinstance(devices, ast.Constant) and devices.value == 1):
            return False
        if nodes is not None and not (isinstance(nodes, ast.Constant) and nodes.value == 1):
            return False
    return True


# Fabric strategies whose launch() starts workers from the parent: the code before it runs once
_FORKING = ("spawn", "fork", "notebook")


def fabric_launch(facts: ModuleFacts) -> Launch:
    """The scopes that call ``launch()`` on a Lightning ``Fabric`` that re-runs the script in
    every process, and the ids of their statements that call it.

    Fabric's default launcher starts the other local ranks as new processes running the script
    from the top (under torchrun every process already does): each of them runs the code
    before ``launch()`` too, after the launching process has run it alone. A file that code
    creates only when it is missing (a dataset's ``download=True``) is then made once; one it
    writes unconditionally (a config dump) is rewritten by every rank. A ``*spawn``/``*fork``/
    ``*notebook`` strategy starts its workers from the parent instead: none here.

    Example:
        >>> import ast
        >>> src = ("import lightning as L\\ndef main():\\n    f = L.Fabric(devices=4)\\n"
        ...        "    f.launch()\\n")
        >>> facts = ModuleFacts(ast.parse(src))
        >>> launch = fabric_launch(facts)
        >>> [n.name for n in launch.scopes], len(launch.fits)
        (['main'], 1)
        >>> fabric_launch(ModuleFacts(ast.parse(src.replace("devices=4", "strategy='ddp_spawn'"))))
        Launch(scopes=frozenset(), fits=frozenset())
    """
    made = [c for c in facts.calls if tail(call_name(c, facts.imports)) == "Fabric"]
    for call in made:
        strategy = keyword_arg(call, "strategy")
        if isinstance(strategy, ast.Constant) and any(w in str(strategy.value) for w in _FORKING):
            return Launch(frozenset(), frozenset())
    launches = [
        c
        for c in facts.calls
        if made and isinstance(c.func, ast.Attribute) and c.func.attr == "launch"
    ]
    scopes = frozenset(facts.scope_containing(c).node for c in launches)
    return Launch(scopes, calling_statements(facts, scopes, launches))
