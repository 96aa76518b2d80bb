"""Names a ``from module import *`` of the project brings: its own imports too (``mp``).

``from utils import *`` binds every public name of ``utils``, the modules it imports among
them: a ``utils.py`` that starts ``import torch.multiprocessing as mp`` and ``import
torch.distributed as dist`` gives the script ``mp`` and ``dist``. Read without them, the
script's ``mp.spawn(main, ...)`` is no spawn (``mp`` is bound nowhere it can see), its
``__main__`` no launcher, and what it writes before starting the ranks every rank's write (a
random sample's reader: false). :func:`merge_star_imports` copies those import bindings into
the importing module's :class:`~gpu_training.diagnostics.lint.model.Imports`, where the
module binds no such name itself, following ``__all__`` where the module has one and leaving
out ``_private`` names, as Python does.

Example:
    >>> import ast, tempfile
    >>> from pathlib import Path
    >>> from gpu_training.diagnostics.lint.project import Project
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / "utils.py").write_text("import torch.multiprocessing as mp\\n")
    >>> text = "from utils import *\\nmp.spawn(main, nprocs=2)\\n"
    >>> project = Project([root])
    >>> facts = project.add(str(root / "train.py"), ast.parse(text))
    >>> merge_star_imports(project)
    >>> facts.imports.resolve("mp.spawn")
    'torch.multiprocessing.spawn'
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.project import Project

__all__ = ["merge_star_imports"]

_MAX_DEPTH = 3  # `from .common import *` whose `common` stars `from .dist import *`


def merge_star_imports(project: Project) -> None:
    """Give every linted module the import bindings its ``from <project module> import *``
    statements bring (see the module docstring)."""
    for facts in list(project.linted.values()):
        if not facts.imports.stars:
            continue
        bound = facts.module_scope.bindings  # defs, classes, assignments of its own
        gained = {
            name: target
            for name, target in _exported_imports(project, facts, 0).items()
            if name not in bound and name not in facts.imports.names
        }
        if gained:
            facts.imports.names.update(gained)
            facts.memo.clear()  # answers worked out with the names unbound


def _exported_imports(project: Project, facts: ModuleFacts, depth: int) -> dict[str, str]:
    found: dict[str, str] = {}
    if depth >= _MAX_DEPTH:
        return found
    for module, level in facts.imports.stars:
        star = project.module_facts(facts, module, level)
        if star is None or star is facts:
            continue
        public = _declared_all(star.tree)
        names = {**_exported_imports(project, star, depth + 1), **star.imports.names}
        for name, target in names.items():
            if (public is None and not name.startswith("_")) or (public and name in public):
                found.setdefault(name, target)
    return found


def _declared_all(tree: ast.Module) -> frozenset[str] | None:
    """The names of a literal ``__all__ = [...]`` at the module's top level, or None."""
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)
            and isinstance(stmt.value, (ast.List, ast.Tuple))
        ):
            return frozenset(
                e.value
                for e in stmt.value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return None
