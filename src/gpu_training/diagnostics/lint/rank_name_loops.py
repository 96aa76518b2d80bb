"""A loop over the names of the launchers' rank variables (``GT007``/``GT017`` guards).

A script that runs under several launchers reads whichever rank variable is set::

    def _rank() -> int:
        for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
            v = os.environ.get(k)
            if v is not None:
                return int(v)
        return -1

``k`` holds the name of a rank variable, so ``int(os.environ.get(k))`` is a rank, and the
function's ``r in (-1, 0)`` a rank-zero test. Which rank: the first name the launcher sets
wins, and every launcher that sets the local rank sets the global one too (``torchrun``,
``deepspeed``, ``accelerate launch``), so the first name of the tuple is the one read.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = "for k in ('RANK', 'LOCAL_RANK'):\\n    v = os.environ.get(k)\\n"
    >>> facts = ModuleFacts(ast.parse(src))
    >>> name = facts.tree.body[0].body[0].value.args[0]
    >>> [c.value for c in looped_rank_names(facts, name, facts.module_scope)]
    ['RANK', 'LOCAL_RANK']
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, mentions_rank

__all__ = ["looped_rank_names"]


def looped_rank_names(facts: ModuleFacts, name: ast.Name, scope: Scope) -> list[ast.Constant]:
    """The names a loop variable runs over, read inside its loop, when every one is a rank
    variable's (``for k in ("RANK", "LOCAL_RANK"):``); else ``[]``.

    Args:
        facts: The module's facts.
        name: The loop variable where it is read.
        scope: The scope it is read in.
    """
    for loop in facts.scope_nodes.get(scope.node, []):
        if (
            isinstance(loop, ast.For)
            and isinstance(loop.target, ast.Name)
            and loop.target.id == name.id
            and isinstance(loop.iter, (ast.Tuple, ast.List))
            and loop.lineno < name.lineno <= (loop.end_lineno or loop.lineno)
        ):
            names = [n for n in loop.iter.elts if isinstance(n, ast.Constant)]
            every = len(names) == len(loop.iter.elts) > 0
            return names if every and all(mentions_rank(n, facts.imports) for n in names) else []
    return []
