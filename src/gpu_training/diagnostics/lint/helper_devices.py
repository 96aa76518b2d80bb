"""The current GPU used by the project's helpers of a script that never pins one (``GT002``).

A script that creates its process group with no ``torch.cuda.set_device`` leaves every
process's current GPU at ``cuda:0``. ``GT002`` reports it when the script itself places
something on the bare ``"cuda"`` device (``.cuda()``, ``.to("cuda")``). Often the script moves
its batches to ``cuda:<rank>`` correctly and leaves the rest to a helper module: ``DEVICE =
torch.device("cuda" if torch.cuda.is_available() else "cpu")`` at the top of ``utils.py``, a
``build_model()`` ending in ``model.to(DEVICE)``, masks made with ``torch.zeros(...,
device=DEVICE)``. Every rank then builds those on ``cuda:0``: the first GPU holds every rank's
copy, and a tensor on ``cuda:0`` meets the rank's batch on ``cuda:<rank>`` in one operation.
The helpers are read one call deep: functions of another module of the project that the
script calls. As for the script's own devices, a process alone on its machine (a literal group
rank) or alone with one visible GPU has no other rank on its ``cuda:0``.

Example:
    >>> import ast, tempfile
    >>> from pathlib import Path
    >>> from gpu_training.diagnostics.lint.project import Project
    >>> root = Path(tempfile.mkdtemp())
    >>> texts = {"helpers.py": "import torch\\nDEVICE = torch.device('cuda')\\n"
    ...                        "def build():\\n    return Net().to(DEVICE)\\n",
    ...          "train.py": "from helpers import build\\nm = build()\\n"}
    >>> project = Project([root])
    >>> for name, text in texts.items():
    ...     _ = (root / name).write_text(text)
    ...     facts = project.add(str(root / name), ast.parse(text))
    >>> helper_default_cuda(facts)
    'build() (helpers.py:4) places it on the current GPU'
"""

from __future__ import annotations

import ast
from pathlib import Path

from gpu_training.diagnostics.lint.calls import keyword_arg, node_start
from gpu_training.diagnostics.lint.group_rank import literal_group_rank
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.single_gpu import one_gpu_per_process

__all__ = ["helper_default_cuda"]

_MAX_HOPS = 4
_DEVICE_KEYWORDS = ("device", "map_location")


def helper_default_cuda(facts: ModuleFacts) -> str | None:
    """Where a function of another module that this file calls uses the bare ``cuda`` device.

    Args:
        facts: The file's facts (with its project).

    Returns:
        The evidence (``build() (helpers.py:4) places it on the current GPU``), or None.
    """
    if literal_group_rank(facts) or one_gpu_per_process(facts):
        return None  # one process per machine, or one visible GPU: its cuda:0 is its own
    seen: set[int] = set()
    for call in facts.calls:
        for owner, func in facts.callees(call):
            if owner is facts or id(func) in seen:
                continue  # this file's own code is read by the per-call check
            seen.add(id(func))
            scope = owner.scope_of(func)
            for node in owner.scope_nodes.get(func, []):
                if isinstance(node, ast.Call) and _places_on_current(owner, node, scope):
                    where = Path(owner.path).name
                    return f"{func.name}() ({where}:{node.lineno}) places it on the current GPU"
    return None


def _places_on_current(facts: ModuleFacts, call: ast.Call, scope: Scope) -> bool:
    """``x.cuda()``, ``x.to(DEVICE)``, ``torch.zeros(n, device=DEVICE)`` with ``DEVICE`` the
    bare ``cuda`` device."""
    func = call.func
    method = func.attr if isinstance(func, ast.Attribute) else None
    if method == "cuda" and not call.args and not call.keywords:
        return True
    given = [keyword_arg(call, k) for k in _DEVICE_KEYWORDS]
    if method == "to" and call.args:
        given.append(call.args[0])
    return any(e is not None and _bare_cuda(facts, e, scope, 0) for e in given)


def _bare_cuda(facts: ModuleFacts, expr: ast.expr, scope: Scope, hops: int) -> bool:
    """``"cuda"``, ``torch.device("cuda")``, either branch of ``"cuda" if ... else "cpu"``, or
    a name bound to one of them."""
    if isinstance(expr, ast.Constant):
        return expr.value == "cuda"
    if isinstance(expr, ast.IfExp):
        return any(_bare_cuda(facts, b, scope, hops) for b in (expr.body, expr.orelse))
    if isinstance(expr, ast.Call):
        name = call_name(expr, facts.imports)
        if name != "torch.device" or len(expr.args) != 1 or expr.keywords:
            return False
        return _bare_cuda(facts, expr.args[0], scope, hops)
    key = dotted(expr)
    if key is None or hops >= _MAX_HOPS:
        return False
    values = facts.lookup(key, scope, node_start(expr))
    return any(v is not None and _bare_cuda(facts, v, scope, hops + 1) for v in values)
