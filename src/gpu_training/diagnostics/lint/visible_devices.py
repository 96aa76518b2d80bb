"""The GPU a process picks by narrowing ``CUDA_VISIBLE_DEVICES`` (``GT018``).

``os.environ["CUDA_VISIBLE_DEVICES"] = str(devices[rank])`` before CUDA starts chooses the
one GPU the process will see, as ``torch.cuda.set_device`` does: the index must be the rank
*within the node*. With ``rank`` the global rank (``MPI.COMM_WORLD.Get_rank()``,
``dist.get_rank()``, ``RANK``), the second node's processes index past their node's GPU list
(or name GPUs that are not there). The value is read through ``str()``/``int()``, an
f-string, and a subscript of a device list (``devices[rank]``: the index is ``rank``).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("rank = int(os.environ['RANK'])\\n"
    ...        "os.environ['CUDA_VISIBLE_DEVICES'] = str(gpus[rank])\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> [(ast.unparse(i), line) for i, line, _ in global_visible_devices(facts)]
    [('rank', 2)]
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, dotted
from gpu_training.diagnostics.lint.rank_equal import fstring_values
from gpu_training.diagnostics.lint.setup import global_rank_source

__all__ = ["global_visible_devices"]

_VARIABLE = "CUDA_VISIBLE_DEVICES"


def global_visible_devices(facts: ModuleFacts) -> list[tuple[ast.expr, int, str]]:
    """Each index a ``CUDA_VISIBLE_DEVICES`` assignment of the module takes from the global
    rank: ``(index expression, line, evidence)``."""
    found: list[tuple[ast.expr, int, str]] = []
    for node in facts.nodes:
        if not isinstance(node, ast.Assign) or not any(_is_visible(facts, t) for t in node.targets):
            continue
        scope = facts.scope_containing(node)
        for index in _indices(node.value):
            evidence = global_rank_source(facts, index, scope)
            if evidence is not None:
                found.append((index, node.lineno, evidence))
                break
    return found


def _is_visible(facts: ModuleFacts, target: ast.expr) -> bool:
    return (
        isinstance(target, ast.Subscript)
        and facts.imports.resolve(dotted(target.value)) == "os.environ"
        and isinstance(target.slice, ast.Constant)
        and target.slice.value == _VARIABLE
    )


def _indices(value: ast.expr) -> list[ast.expr]:
    """The expressions the value is made from, outermost first: through ``str(x)``,
    ``f"{x}"``, and both ``gpus[x]`` and its index ``x``."""
    found: list[ast.expr] = []
    stack = [value]
    while stack:
        expr = stack.pop()
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.args:
            if expr.func.id in ("str", "int"):
                stack.append(expr.args[0])
            continue
        if isinstance(expr, ast.JoinedStr):
            stack += fstring_values(expr)
        elif isinstance(expr, ast.Subscript):  # `os.environ["RANK"]` itself, or `gpus[rank]`
            found.append(expr)
            stack.append(expr.slice)
        else:
            found.append(expr)
    return found


def cuda_fstring_indices(facts: ModuleFacts) -> list[tuple[ast.expr, ast.JoinedStr]]:
    """Every ``f"cuda:{x}"`` of the module, wherever it goes (``pipe.build_stage(i,
    f"cuda:{i}")``, ``device = f"cuda:{stage}"``): ``(x, the f-string)``. The text before the
    value must end in ``cuda:``, so ``x`` is a GPU index."""
    found: list[tuple[ast.expr, ast.JoinedStr]] = []
    for node in facts.nodes:
        if not isinstance(node, ast.JoinedStr):
            continue
        for before, value in zip(node.values, node.values[1:], strict=False):
            if (
                isinstance(before, ast.Constant)
                and isinstance(before.value, str)
                and before.value.endswith("cuda:")
                and isinstance(value, ast.FormattedValue)
            ):
                found.append((value.value, node))
    return found
