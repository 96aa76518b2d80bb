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
    >>> import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, dotted
    >>> file_framework({"Accelerator", "prepare"}, ModuleFacts(ast.parse("a = Accelerator()")))
    'accelerate'
    >>> file_framework({"init_accelerator"}, ModuleFacts(ast.parse("a = init_accelerator()")))
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, dotted

__all__ = ["file_framework"]

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
    for call in facts.calls:
        for summary in facts.summaries(call):
            for kind in sorted(summary.returns & _RETURNED.keys()):
                return _RETURNED[kind]
    return _annotated(facts)


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
