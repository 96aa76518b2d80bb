"""``DataParallel`` as one named mode of a script that also offers DDP (``GT001``).

A script whose ``if``/``elif`` chain picks the parallel wrapper by a string option
(``if args.mode == "dp": DataParallel(model) elif args.mode == "ddp": DDP(model)``) runs
``DataParallel`` only when its user names that mode; the same chain's other branch already
gives the one-process-per-GPU wrapper ``GT001`` recommends. The choice is the user's, made
beside DDP (a comparison baseline, a one-node fallback chosen by name), not a script stuck on
``DataParallel``. The automatic fallback (``if distributed: DDP(...) else: DataParallel(...)``,
``if n_gpu > 1: DataParallel(...)``) tests no named mode and stays reported.

Example:
    >>> import ast
    >>> src = ("if args.mode == 'dp':\\n    m = nn.DataParallel(m)\\n"
    ...        "elif args.mode == 'ddp':\\n    m = DDP(m, device_ids=[rank])\\n")
    >>> tree = ast.parse(src)
    >>> named_mode_beside_ddp(tree, tree.body[0].body[0].value)
    True
    >>> tree = ast.parse("if ddp:\\n    m = DDP(m)\\nelse:\\n    m = nn.DataParallel(m)\\n")
    >>> named_mode_beside_ddp(tree, tree.body[0].orelse[0].value)
    False
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import dotted

__all__ = ["named_mode_beside_ddp"]

_PER_PROCESS = frozenset(
    {"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "fully_shard"}
)


def _mode_test(test: ast.expr) -> tuple[str, str] | None:
    """``args.mode == "dp"`` (either side): the option's name and the test's text; ``None``
    for any other test."""
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return None
    left, right = test.left, test.comparators[0]
    if isinstance(test.ops[0], ast.Eq):
        subject, value = (right, left) if isinstance(left, ast.Constant) else (left, right)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            name = dotted(subject)
            return (name, ast.unparse(test)) if name else None
    return None


def _chain(node: ast.If) -> list[tuple[ast.expr | None, list[ast.stmt]]]:
    """The ``(test, body)`` branches of an ``if``/``elif`` chain, its final ``else:`` with the
    test ``None``."""
    branches: list[tuple[ast.expr | None, list[ast.stmt]]] = []
    current: ast.If | None = node
    while current is not None:
        branches.append((current.test, current.body))
        orelse = current.orelse
        current = orelse[0] if len(orelse) == 1 and isinstance(orelse[0], ast.If) else None
        if current is None and orelse:
            branches.append((None, orelse))
    return branches


def _contains(body: list[ast.stmt], target: ast.AST) -> bool:
    return any(sub is target for stmt in body for sub in ast.walk(stmt))


def _wraps_per_process(body: list[ast.stmt]) -> bool:
    return any(
        isinstance(sub, ast.Call) and tail(dotted(sub.func) or "") in _PER_PROCESS
        for stmt in body
        for sub in ast.walk(stmt)
    )


def named_mode_beside_ddp(scope_node: ast.AST, call: ast.AST) -> bool:
    """Whether ``call`` sits in a branch of an ``if``/``elif``/``else`` chain whose every test
    compares one option with a string literal, and another branch of that chain wraps a model
    in DDP or FSDP."""
    for node in ast.walk(scope_node):
        if not isinstance(node, ast.If):
            continue
        branches = _chain(node)
        tests = [_mode_test(test) for test, _ in branches if test is not None]
        if len(branches) < 2 or any(t is None for t in tests):
            continue
        if len({t[0] for t in tests if t is not None}) != 1:
            continue
        inside = [i for i, (_, body) in enumerate(branches) if _contains(body, call)]
        if inside and any(
            _wraps_per_process(body) for i, (_, body) in enumerate(branches) if i != inside[0]
        ):
            return True
    return False
