"""The project's base classes of a file's classes, in other modules (``GT005`` across a class
hierarchy).

A subclass runs its base class's methods in the same process, on the same object: a loader
the base class builds over a shuffling ``DistributedSampler`` (``self.dataloaders[task] =
DataLoader(..., sampler=DistributedSampler(ds))`` in ``vanilla.py``) is what the subclass's
overridden epoch loop iterates (``class AGEMTrainer(VanillaTrainer)`` in ``agem.py``, whose
``train_task`` loops over the loader the base class's ``continual_learning`` hands it). So the
subclass's file takes on the base module's never-reseeded sampler and its process group, as a
file does from one that imports it (:meth:`FileChecker.inherit`).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.project import Project
    >>> project = Project()
    >>> facts = project.add("t.py", ast.parse("class A:\\n    pass\\nclass B(A):\\n    pass\\n"))
    >>> base_modules(facts, project)
    []
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.model import ModuleFacts, dotted

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.project import Project

__all__ = ["base_modules", "project_class"]


def base_modules(facts: ModuleFacts, project: Project, depth: int = 0) -> list[ModuleFacts]:
    """The other modules of the project that define a base class of one of ``facts``'s
    classes (``from .vanilla import VanillaTrainer``; ``base.Trainer``), and their own base
    classes' modules in turn (a few levels)."""
    found: list[ModuleFacts] = []
    if depth > 4:
        return found
    for cls in (n for n in facts.nodes if isinstance(n, ast.ClassDef)):
        for base in cls.bases:
            target = _defining_module(facts, base)
            if target is not None and target is not facts and target not in found:
                found.append(target)
                found += [m for m in base_modules(target, project, depth + 1) if m not in found]
    return found


def _defining_module(facts: ModuleFacts, base: ast.expr) -> ModuleFacts | None:
    found = project_class(facts, dotted(base))
    return found[0] if found is not None else None


def project_class(facts: ModuleFacts, name: str | None) -> tuple[ModuleFacts, ast.ClassDef] | None:
    """The class of the project a (dotted) name read in ``facts`` stands for, with its module:
    a top-level class of the file, or one imported (``from .vanilla import VanillaTrainer``;
    ``import base`` then ``base.Trainer``; ``from pkg import base`` then ``base.Trainer``).

    Example:
        >>> from gpu_training.diagnostics.lint.project import Project
        >>> facts = Project().add("t.py", ast.parse("class A:\\n    pass\\n"))
        >>> project_class(facts, "A")[1].name
        'A'
    """
    if not name:
        return None
    local = facts.toplevel.get(name)
    if isinstance(local, ast.ClassDef) and name not in facts.imports.names:
        return facts, local
    head, *rest = name.split(".")
    if head not in facts.imports.origins or len(rest) > 1 or facts.resolver is None:
        return None
    module, level, symbol = facts.imports.origins[head]
    if symbol is not None and rest:  # `from pkg import base` then `base.Trainer`
        module, cls = f"{module}.{symbol}" if module else symbol, rest[0]
    elif symbol is not None:  # `from .vanilla import VanillaTrainer`
        cls = symbol
    elif rest:  # `import pkg.base as base`, then `base.Trainer`
        cls = rest[0]
    else:
        return None
    owner = facts.resolver.module_facts(facts, module, level)
    target = owner.toplevel.get(cls) if owner is not None else None
    return (owner, target) if owner is not None and isinstance(target, ast.ClassDef) else None
