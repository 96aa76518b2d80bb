"""A script's modes: the branch of a dispatch that never makes the process group runs alone.

A training script often dispatches on its arguments before anything distributed happens::

    if args.merge_lora:
        merge_and_save(args)      # python train.py --merge_lora --checkpoint ...
    elif args.checkpoint is None:
        smoke_test()              # python train.py
    else:
        train(args)               # torchrun ... train.py --checkpoint ...: makes the group

Only ``train`` makes the process group; the other modes never join one, so they are run as one
process (nothing in them waits for a rank, nothing tells them theirs) and their writes have
one writer. Such a branch is read as one process when the other side of the same ``if`` makes
the group and nothing before the ``if`` in its function (or module) did: the group does not
exist yet on either path. A body that ends the program (``merge(); sys.exit(0)``) above the
code that makes the group is such a branch too. A branch after the group exists
(``if args.eval: evaluate()`` below ``init_process_group``) runs on every rank as before.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> from gpu_training.diagnostics.lint.ranks import RankAnalysis
    >>> src = ("import torch.distributed as dist\\n"
    ...        "def train():\\n    dist.init_process_group('nccl')\\n"
    ...        "if merge:\\n    save()\\nelse:\\n    train()\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> ranks = RankAnalysis(facts, distributed=True)
    >>> groupless_side(ranks, facts.tree.body[2], facts.module_scope)
    'body'
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.context import terminates
from gpu_training.diagnostics.lint.model import Scope

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.ranks import RankAnalysis

__all__ = ["groupless_side"]


def groupless_side(ranks: RankAnalysis, stmt: ast.If, scope: Scope) -> str | None:
    """``"body"`` or ``"else"``: the side of ``stmt`` that never makes the group while the
    other side does, before any group exists in its scope; None otherwise.

    Args:
        ranks: The file's rank analysis (what makes the group).
        stmt: An ``if`` whose test is no rank test.
        scope: Its function or module.
    """
    if not ranks.group_creators:
        return None  # nothing in the file makes the group
    if _first_maker(ranks, id(scope.node), getattr(scope.node, "body", [])) < stmt.lineno:
        return None  # the group exists already: a branch below runs on every rank
    body_makes = ranks.creates_group(stmt.body)
    block: list[ast.stmt] = []
    index = 0
    if stmt.orelse:
        else_makes = ranks.creates_group(stmt.orelse)
    elif terminates(stmt.body) and not body_makes:
        # `if args.merge_lora: merge(); sys.exit(0)` with the group made below: a mode
        block, index = _place(ranks, scope.node).get(id(stmt), ([], 0))
        else_makes = ranks.creates_group(block[index + 1 :])
    else:
        return None
    if body_makes == else_makes:
        return None
    if not block:
        block, index = _place(ranks, scope.node).get(id(stmt), ([], 0))
    if _first_maker(ranks, id(block), block) < stmt.lineno:
        return None
    return "else" if body_makes else "body"


def _place(ranks: RankAnalysis, node: ast.AST) -> dict[int, tuple[list[ast.stmt], int]]:
    """``id(statement)`` -> (the statement list of ``node`` that holds it, its index), once
    per scope."""
    key = ("statement-blocks", id(node))
    cached = ranks.facts.memo.get(key)
    if isinstance(cached, dict):
        return cached
    places: dict[int, tuple[list[ast.stmt], int]] = {}
    for sub in ast.walk(node):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(sub, field, None)
            if isinstance(block, list):
                places.update((id(s), (block, i)) for i, s in enumerate(block))
    ranks.facts.memo[key] = places
    return places


def _first_maker(ranks: RankAnalysis, key: int, block: list[ast.stmt]) -> float:
    """The earliest last line of a statement of ``block`` that makes the group (infinity:
    none), once per block: a statement ending above an ``if`` made it before the ``if`` (one
    holding the ``if`` ends below it)."""
    memo = ("first-group-maker", key)
    cached = ranks.facts.memo.get(memo)
    if isinstance(cached, (int, float)):
        return cached
    first = min(
        (s.end_lineno or s.lineno for s in block if ranks.creates_group([s])), default=float("inf")
    )
    ranks.facts.memo[memo] = first
    return first
