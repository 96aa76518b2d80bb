"""Code that runs only where a model is not wrapped (``GT006``).

``GT006`` reports a saved ``ddp.state_dict()``: its keys carry ``module.``. A script that
saves either way tests the wrapper first::

    if hasattr(model, "module"):
        state_dict = model.module.state_dict()
    else:
        state_dict = model.state_dict()

The ``else`` runs only where ``model`` has no ``.module``: one process, no wrapper, keys
without the prefix. So does the body of ``if not hasattr(model, "module"):``, the ``else`` of
``if isinstance(model, DistributedDataParallel):``, and the same two sides of a conditional
expression (``m.module.state_dict() if hasattr(m, "module") else m.state_dict()``).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("if hasattr(m, 'module'):\\n    s = m.module.state_dict()\\n"
    ...        "else:\\n    s = m.state_dict()\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> call = facts.tree.body[0].orelse[0].value
    >>> unwrapped_here(facts, call, call.func.value)
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import parents, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, dotted

__all__ = ["unwrapped_here"]

_WRAPPERS = frozenset(
    {"DistributedDataParallel", "DDP", "DataParallel", "FullyShardedDataParallel", "FSDP"}
)


def unwrapped_here(facts: ModuleFacts, node: ast.AST, owner: ast.expr) -> bool:
    """Whether ``node`` runs only on the side of a test where ``owner`` is not wrapped.

    Args:
        facts: The module's facts.
        node: The expression (a ``state_dict()`` call).
        owner: The model it is read from.
    """
    name = dotted(owner)
    if name is None:
        return False
    up = parents(facts)
    child, parent = node, up.get(id(node))
    while parent is not None:
        if isinstance(parent, (ast.If, ast.IfExp)):
            wrapped = _says_wrapped(parent.test, name)
            body = parent.body if isinstance(parent.body, list) else [parent.body]
            orelse = parent.orelse if isinstance(parent.orelse, list) else [parent.orelse]
            if (wrapped is True and any(child is c for c in orelse)) or (
                wrapped is False and any(child is c for c in body)
            ):
                return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        child, parent = parent, up.get(id(parent))
    return False


def _says_wrapped(test: ast.expr, name: str) -> bool | None:
    """True: the test holds where ``name`` is wrapped (``hasattr(m, "module")``,
    ``isinstance(m, DDP)``); False: where it is not (``not ...``); None: neither."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _says_wrapped(test.operand, name)
        return None if inner is None else not inner
    if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and len(test.args) == 2):
        return None
    subject, what = test.args
    if dotted(subject) != name:
        return None
    if test.func.id == "hasattr":
        return True if isinstance(what, ast.Constant) and what.value == "module" else None
    if test.func.id == "isinstance":
        kinds = what.elts if isinstance(what, ast.Tuple) else [what]
        return True if any(tail(dotted(k)) in _WRAPPERS for k in kinds) else None
    return None
