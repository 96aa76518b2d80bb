"""``GT006``: a project whose own loaders strip the wrapper's ``module.`` key prefix.

``GT006`` reports a saved ``ddp.state_dict()`` because its keys carry ``module.`` and the
checkpoint then fails to load into a plain model. Where the project's own loading code
removes that prefix before ``load_state_dict`` (``{k.replace("module.", ""): v ...}``,
``k[7:]``, ``k.removeprefix("module.")``, torch's ``consume_prefix_in_state_dict_if_present(sd,
"module.")``), the checkpoints it writes are read back by its inference and resume paths:
the failure the rule describes does not happen in that project, so its saves are not
reported. A prefix stripped in a function (or module body) that never calls
``load_state_dict`` does not count, nor a loader in an unrelated directory (another project
linted in the same run): the loader's directory must hold the saving file's, or lie under it.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("sd = torch.load(path)\\n"
    ...        "net.load_state_dict({k.replace('module.', ''): v for k, v in sd.items()})\\n")
    >>> loaders = prefix_loaders([ModuleFacts(ast.parse(src), "proj/infer.py")])
    >>> reads_back("proj/tools/train.py", loaders), reads_back("other/train.py", loaders)
    (True, False)
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name

__all__ = ["prefix_loaders", "reads_back"]

_STRIPPERS = frozenset(
    {"replace", "removeprefix", "sub", "consume_prefix_in_state_dict_if_present"}
)
_PREFIX_LEN = len("module.")


def prefix_loaders(modules: Iterable[ModuleFacts]) -> list[Path]:
    """The directories of the project's modules with a loader that removes ``module.`` from
    the keys it loads (a function, or module body, that calls ``load_state_dict`` and strips
    the prefix).

    Args:
        modules: The project's linted modules.

    Returns:
        Each such module's directory, resolved.
    """
    found: list[Path] = []
    for facts in modules:
        for nodes in facts.scope_nodes.values():
            calls = [n for n in nodes if isinstance(n, ast.Call)]
            if not any(tail(call_name(c, facts.imports)) == "load_state_dict" for c in calls):
                continue
            if any(_strips(node, facts) for node in nodes):
                found.append(Path(facts.path).resolve().parent)
                break
    return found


def reads_back(path: str, loaders: list[Path]) -> bool:
    """Whether a saving file's checkpoints are read by one of those loaders: one in its own
    directory, below it (``models/build.py`` beside ``train.py``) or above it (the
    repository's ``infer.py`` for ``tools/train.py``).

    Args:
        path: The saving file.
        loaders: :func:`prefix_loaders`.

    Returns:
        True when a loader's directory holds the file's or lies under it.
    """
    here = Path(path).resolve().parent
    return any(d == here or here in d.parents or d in here.parents for d in loaders)


def _strips(node: ast.AST, facts: ModuleFacts) -> bool:
    """``k.replace("module.", "")`` and kin, or the slice ``k[7:]`` past the prefix."""
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
            isinstance(lower, ast.Constant)
            and lower.value == _PREFIX_LEN
            and node.slice.upper is None
            and isinstance(node.value, ast.Name)
        )
    return False
