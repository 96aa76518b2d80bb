"""How ``gpu-training lint`` reads a call site: the callee's last name and the arguments bound.

Every rule module asks an ``ast.Call`` the same few questions — what is the callee called
(``torch.utils.data.DataLoader`` → ``DataLoader``), what did it get as ``shuffle``, by keyword
or by position, where does it start, does the module run itself (an ``if __name__ ==
"__main__":`` block)? — so the answers live here once, below
:mod:`~gpu_training.diagnostics.lint.checks`, :mod:`~gpu_training.diagnostics.lint.ranks` and
:mod:`~gpu_training.diagnostics.lint.training_loop`, which all import them.

Example:
    >>> import ast
    >>> call = ast.parse("DataLoader(ds, 32, True, shuffle=False)", mode="eval").body
    >>> ast.unparse(call_arg(call, 2, "shuffle"))  # the keyword is read first
    'False'
    >>> tail("torch.utils.data.DataLoader"), node_start(call)
    ('DataLoader', (1, 0))
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.model import ModuleFacts

__all__ = [
    "call_arg",
    "enclosing_blocks",
    "has_main_block",
    "is_const",
    "is_literal",
    "is_main_block",
    "keyword_arg",
    "node_end",
    "node_start",
    "parameter_index",
    "parents",
    "runs_itself",
    "tail",
]


def tail(name: str | None) -> str:
    """The last part of a dotted name (``""`` for None): ``"torch.save"`` → ``"save"``."""
    return "" if name is None else name.rsplit(".", 1)[-1]


def is_literal(expr: ast.expr) -> bool:
    """A constant, or a negated one: ``-1``, ``"main"``, ``not True``."""
    if isinstance(expr, ast.UnaryOp):
        return is_literal(expr.operand)
    return isinstance(expr, ast.Constant)


def keyword_arg(call: ast.Call, name: str) -> ast.expr | None:
    """The value passed as ``name=...`` to ``call`` (None: not passed by keyword)."""
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def call_arg(call: ast.Call, index: int, name: str) -> ast.expr | None:
    """The value bound to a parameter: by keyword ``name``, else the ``index``-th positional.

    Args:
        call: The call.
        index: The parameter's position (0-based) in the callee's signature; negative for a
            keyword-only parameter (:func:`parameter_index`).
        name: The parameter's name.

    Returns:
        The argument expression, or None when not passed (or hidden behind ``*args``).
    """
    value = keyword_arg(call, name)
    if value is None and 0 <= index < len(call.args):
        candidate = call.args[index]
        value = None if isinstance(candidate, ast.Starred) else candidate
    return value


def parameter_index(func: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> int:
    """Where a call site passes parameter ``name`` of ``func`` by position: its index among the
    positional parameters, a leading ``self``/``cls`` left out (the call does not pass it);
    -1 for a keyword-only parameter or a name ``func`` does not have.

    Example:
        >>> func = ast.parse("def f(self, model, rank, *, seed): pass").body[0]
        >>> parameter_index(func, "rank"), parameter_index(func, "seed")
        (1, -1)
    """
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    if name not in params:
        return -1
    return params.index(name) - (1 if params[0] in ("self", "cls") else 0)


def is_const(expr: ast.expr | None, value: object) -> bool:
    """Whether ``expr`` is the literal singleton ``value`` (``True``, ``False``, ``None``)."""
    return isinstance(expr, ast.Constant) and expr.value is value


def node_start(node: ast.AST) -> tuple[int, int]:
    """Where a node starts: ``(line, col)``, ``col`` 0-based as in :mod:`ast`."""
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def node_end(node: ast.AST) -> tuple[int, int]:
    """Where a node ends: ``(line, col)``, as :func:`node_start` (0 when unknown: a linted
    module's expressions other than ``:=`` have no end, see :mod:`.positions`)."""
    return (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)


def is_main_block(node: ast.AST) -> bool:
    """``if __name__ == "__main__":`` (any test that names ``"__main__"``)."""
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def has_main_block(tree: ast.Module) -> bool:
    """The module runs itself: a top-level ``if __name__ == "__main__":`` block."""
    return any(is_main_block(node) for node in tree.body)


_CONTAINERS = (ast.Dict, ast.List, ast.Tuple, ast.Set, ast.DictComp, ast.ListComp)


def runs_itself(tree: ast.Module) -> bool:
    """A script: an ``if __name__ == "__main__":`` block, a call at the top level, or a top
    level that binds what a function or class of its own returns (``python evaluation.py``
    runs it; not a dataclass's value, nor a table of such values: ``CONFIGS = {"a":
    Config(...)}``)."""
    own = {  # a dataclass builds a value and runs nothing
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and not any("dataclass" in ast.unparse(d) for d in node.decorator_list)
    }
    for node in tree.body:
        if is_main_block(node):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return True  # `main()`, `dist.init_process_group(...)` at the top level
        if (
            isinstance(node, ast.Assign)
            and not isinstance(node.value, _CONTAINERS)  # a table of configs runs nothing
            and any(
                isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in own
                for sub in ast.walk(node)
            )
        ):
            return True
    return False


def enclosing_blocks(body: list[ast.stmt], node: ast.AST) -> list[tuple[list[ast.stmt], int]]:
    """The statement lists that hold ``node``, outermost first, with the index in each."""
    found: list[tuple[list[ast.stmt], int]] = []
    target = node_start(node)
    block: list[ast.stmt] | None = body
    while block:
        inner: list[ast.stmt] | None = None
        for index, stmt in enumerate(block):
            end = (getattr(stmt, "end_lineno", 0) or 0, getattr(stmt, "end_col_offset", 0) or 0)
            if node_start(stmt) <= target <= end:
                found.append((block, index))
                for name in ("body", "orelse", "finalbody", "handlers"):
                    child = getattr(stmt, name, None)
                    if isinstance(child, list) and any(
                        node_start(c)
                        <= target
                        <= (getattr(c, "end_lineno", 0) or 0, getattr(c, "end_col_offset", 0) or 0)
                        for c in child
                    ):
                        inner = child
                        break
                break
        if inner is not None and inner and isinstance(inner[0], ast.ExceptHandler):
            handler = next(
                h for h in inner if node_start(h) <= target
            )  # the handler's own body holds it
            inner = getattr(handler, "body", None)
        block = inner
    return found


def parents(facts: ModuleFacts) -> dict[int, ast.AST]:
    """``id(node)`` -> the node that holds it, for every node of the module (kept in
    ``facts.memo``): where a value goes (``model = Net().to(torch.bfloat16)``, a call formatted
    into a message)."""
    found = facts.memo.get("parents")
    if not isinstance(found, dict):
        found = {id(child): node for node in facts.nodes for child in ast.iter_child_nodes(node)}
        facts.memo["parents"] = found
    return found
