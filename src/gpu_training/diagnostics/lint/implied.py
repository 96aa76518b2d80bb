"""What a branch of an ``if`` tells about its test's parts, and when two branches exclude each other.

Inside ``if a and b:`` both ``a`` and ``b`` hold; in its ``else`` the whole test fails, and in
the ``else`` of ``if a:`` (or the body of ``if not a:``) ``a`` fails. Two places whose branches
say opposite things of one expression never run in one pass of the function, provided no name
the expressions read is reassigned between them (the caller checks that). Used for a model
wrapped on one side of a flag and saved on the other (``saved_wrappers``) and for the flag that
lets every rank past a rank-0 early return (``released``).

Example:
    >>> import ast
    >>> wrap = ast.parse("torch.cuda.device_count() > 1 and cfg.DIST", mode="eval").body
    >>> save = ast.parse("cfg.DIST", mode="eval").body
    >>> contradict(known(wrap, True), known(save, False))
    True
    >>> contradict(known(wrap, False), known(save, False))
    False
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted

__all__ = ["contradict", "known", "unchanged"]


def known(test: ast.expr, holds: bool) -> frozenset[tuple[str, bool]]:
    """``(ast.dump(part), truth)`` for what ``test`` being ``holds`` makes certain.

    Args:
        test: An ``if`` test.
        holds: True for the ``if`` body, False for its ``else``.

    Returns:
        The whole test with its truth, and each part the branch settles: every operand of an
        ``and`` that holds, every operand of an ``or`` that fails, through ``not``.
    """
    found: set[tuple[str, bool]] = set()
    _collect(test, holds, found)
    return frozenset(found)


def _collect(test: ast.expr, holds: bool, found: set[tuple[str, bool]]) -> None:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        _collect(test.operand, not holds, found)
        return
    found.add((ast.dump(test), holds))
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) == holds:
        for part in test.values:  # `a and b` holds, or `a or b` fails: each part alike
            _collect(part, holds, found)


def contradict(first: frozenset[tuple[str, bool]], second: frozenset[tuple[str, bool]]) -> bool:
    """Whether two sets of :func:`known` facts give one expression opposite truths."""
    return any((text, not truth) in second for text, truth in first)


def unchanged(facts: ModuleFacts, scope: Scope, test: ast.expr, start: int, end: int) -> bool:
    """No name the test reads is assigned in the function between lines ``start`` and ``end``."""
    read = {dotted(n) for n in ast.walk(test) if isinstance(n, (ast.Name, ast.Attribute))}
    for node in facts.scope_nodes.get(scope.node, []):
        if (
            isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            and start < node.lineno < end
        ):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(dotted(n) in read for t in targets for n in ast.walk(t)):
                return False
    return True
