"""``GT017``: writes made by local rank 0 of every node, where they run and where they are called.

A write under a node-local guard (``if local_rank == 0:``) is made by one process of every
node, all to the same path on a shared filesystem. Two refinements of where that is reported:

* :func:`node_local_write` — the write itself, unless its path names the node (one file per
  node) or it sits in a module-level function that nothing in the project names (never
  called, imported or passed: dead code runs on no node).
* :func:`call_site_node_writes` — a helper of another module whose write runs under its
  callers' node-local guard is reported once, in the helper; but each guarded call is a
  place the bug happens and is fixed (guard it with the global rank), so every call made
  under a node-local guard is reported too, pointing at the write it reaches. The same
  helper called from two guarded places is two writers per node, not one.

Example:
    >>> from pathlib import Path
    >>> import tempfile
    >>> from gpu_training.diagnostics.lint import lint_paths
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / ".git").mkdir()
    >>> _ = (root / "util.py").write_text(
    ...     "def dump(cfg):\\n    with open('run.yaml', 'w') as f:\\n        f.write(cfg)\\n")
    >>> _ = (root / "train.py").write_text(
    ...     "import os\\nimport torch.distributed as dist\\nfrom util import dump\\n"
    ...     "dist.init_process_group('nccl')\\nlocal_rank = int(os.environ['LOCAL_RANK'])\\n"
    ...     "if local_rank == 0:\\n    dump('x')\\n")
    >>> sorted((Path(f.path).name, f.line) for f in lint_paths([root]).findings if f.code == "GT017")
    [('train.py', 7), ('util.py', 2)]
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.calls import node_start
from gpu_training.diagnostics.lint.context import Ctx, RawFinding, names_node
from gpu_training.diagnostics.lint.helper_writes import written_functions
from gpu_training.diagnostics.lint.micro_batches import named_anywhere
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.checks import FileChecker

__all__ = ["call_site_node_writes", "node_local_write"]


def node_local_write(call: ast.Call, ctx: Ctx, scope: Scope, facts: ModuleFacts) -> bool:
    """Whether a write runs on local rank 0 of every node, to one path for all of them.

    Args:
        call: The writing call.
        ctx: Its context (``local_only``: rank 0 by node-local guards only).
        scope: The function it is in.
        facts: Its module's facts.

    Returns:
        True for a node-local write to a shared path in code that runs.
    """
    return (
        ctx.local_only
        and not names_node(call, facts)
        and named_anywhere(facts, _outermost(scope).node)
    )


def _outermost(scope: Scope) -> Scope:
    """The module-level function (or the module) a scope is nested in."""
    while scope.parent is not None and scope.parent.parent is not None:
        scope = scope.parent
    return scope


def call_site_node_writes(
    checkers: Mapping[str, FileChecker], results: Mapping[str, list[RawFinding] | str]
) -> dict[str, list[RawFinding]]:
    """The ``GT017`` findings to add at the node-locally guarded calls of writing helpers.

    Args:
        checkers: Each linted file's checker, after its report.
        results: Each file's findings (or the reason it could not be analysed).

    Returns:
        Path → the findings to add there: calls of another file's function whose write is
        reported ``GT017``, made under a node-local guard (``if local_rank == 0:``).
    """
    writes = written_functions(checkers, results, "GT017")
    added: dict[str, list[RawFinding]] = {}
    for path, checker in checkers.items():
        if isinstance(results.get(path), str):
            continue
        seen: set[int] = set()
        for (facts, func), ctx, _, call in checker.outgoing:
            write = writes.get(id(func))
            if write is None or facts.path == path or id(call) in seen:
                continue
            seen.add(id(call))
            if not ctx.local_only or names_node(call, checker.facts):
                continue
            line, col = node_start(call)
            detail = f"{func.name} writes ({write[0]}:{write[1]}) under {ctx.guard}: "
            added.setdefault(path, []).append(
                RawFinding(line, col, "GT017", detail + "local rank 0 of every node")
            )
    return added
