"""``GT006``: a project whose own loaders strip the wrapper's ``module.`` key prefix.

``GT006`` reports a saved ``ddp.state_dict()`` because its keys carry ``module.`` and the
checkpoint then fails to load into a plain model. Where the project's own loading code
removes that prefix before ``load_state_dict`` (``{k.replace("module.", ""): v ...}``,
``k[7:]``, ``k.removeprefix("module.")``, torch's ``consume_prefix_in_state_dict_if_present(sd,
"module.")``), the checkpoints it writes are read back by its inference and resume paths:
the failure the rule describes does not happen in that project, so its saves are not
reported. The prefix may be stripped by a helper the loader calls for the state it loads
(``model.load_state_dict(load_checkpoint(...))`` where ``load_checkpoint`` returns
``remove_ddp_in_checkpoint(torch.load(path))``). A prefix stripped in a function (or module
body) that no loader calls does not count, nor a loader the saving file does not reach: the saving
file must be the loader's or import it (through at most three modules), so that the code path
writing the checkpoint is the one that reads it back; a stand-alone deploy script that strips
the prefix speaks for itself only.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("sd = torch.load(path)\\n"
    ...        "net.load_state_dict({k.replace('module.', ''): v for k, v in sd.items()})\\n")
    >>> [f.path for f in prefix_loaders([ModuleFacts(ast.parse(src), "infer.py")])]
    ['infer.py']
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.project import Project

__all__ = ["prefix_loaders", "reading_back"]

_STRIPPERS = frozenset(
    {"replace", "removeprefix", "sub", "consume_prefix_in_state_dict_if_present"}
)
_PREFIX_LEN = len("module.")
_MAX_IMPORT_HOPS = 3
_MAX_HELPER_HOPS = 2
"""``load_checkpoint`` → ``remove_ddp_in_checkpoint``: the helpers followed from a loader."""
_NOT_HELPERS = frozenset({"load_state_dict", "load", "print"})


def prefix_loaders(modules: Iterable[ModuleFacts]) -> list[ModuleFacts]:
    """The project's modules with a loader that removes ``module.`` from the keys it loads
    (a function, or module body, that calls ``load_state_dict`` and strips the prefix).

    Args:
        modules: The project's linted modules.

    Returns:
        Those modules.
    """
    found: list[ModuleFacts] = []
    for facts in modules:
        for nodes in facts.scope_nodes.values():
            calls = [n for n in nodes if isinstance(n, ast.Call)]
            if not any(tail(call_name(c, facts.imports)) == "load_state_dict" for c in calls):
                continue
            if any(_strips(node, facts) for node in nodes) or any(
                _calls_stripper(facts, c, _MAX_HELPER_HOPS) for c in calls
            ):
                found.append(facts)
                break
    return found


def _calls_stripper(facts: ModuleFacts, call: ast.Call, hops: int) -> bool:
    """The call runs a function of the project that strips the prefix from what it returns
    (``load_checkpoint(...)`` returning ``remove_ddp_in_checkpoint(torch.load(...))``), through
    at most ``hops`` helpers."""
    if tail(call_name(call, facts.imports)) in _NOT_HELPERS:
        return False
    for owner, func in facts.callees(call):
        nodes = owner.scope_nodes.get(func, [])
        if any(_strips(node, owner) for node in nodes):
            return True
        if hops > 1 and any(
            _calls_stripper(owner, c, hops - 1) for c in nodes if isinstance(c, ast.Call)
        ):
            return True
    return False


def reading_back(loaders: list[ModuleFacts], project: Project) -> set[str]:
    """The files whose checkpoints those loaders read: each loader's own file and the files
    that import it, directly or through the project's packages (``train.py`` imports
    ``models/__init__.py``, which imports ``models/build.py``): the saving code path is wired
    to the stripping loader.

    Args:
        loaders: :func:`prefix_loaders`.
        project: The project.

    Returns:
        Their paths.
    """
    seen = {id(f): f for f in loaders}
    todo = list(loaders)
    for _ in range(_MAX_IMPORT_HOPS):
        todo = [i for f in todo for i in project.importers_of(f) if id(i) not in seen]
        seen.update({id(f): f for f in todo})
    return {f.path for f in seen.values()}


def _strips(node: ast.AST, facts: ModuleFacts) -> bool:
    """``k.replace("module.", "")`` and kin, or the slice ``k[7:]`` (``k[len("module."):]``)
    past the prefix."""
    if isinstance(node, ast.Call) and tail(call_name(node, facts.imports)) in _STRIPPERS:
        return any(
            isinstance(a, ast.Constant)
            and isinstance(a.value, str)
            and a.value.lstrip("^").startswith("module")
            for a in node.args
        )
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        lower = node.slice.lower
        return (
            ((isinstance(lower, ast.Constant) and lower.value == _PREFIX_LEN) or _prefix_len(lower))
            and node.slice.upper is None
            and isinstance(node.value, ast.Name)
        )
    return False


def _prefix_len(expr: ast.expr | None) -> bool:
    """``len("module.")``."""
    return (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == "len"
        and len(expr.args) == 1
        and isinstance(expr.args[0], ast.Constant)
        and expr.args[0].value == "module."
    )
