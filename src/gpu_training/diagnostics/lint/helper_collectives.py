"""``GT009`` at each call, on every rank, of another module's helper that hangs by itself.

A helper whose collective sits under its own rank test (``save_adapter(model, path)``
in ``save_utils.py``: ``if dist.get_rank() == 0: model.save_pretrained(path)`` of an FSDP
model, whose state dict all-gathers) is reported once, in the helper. Every script that
calls it is a run that hangs there: all ranks enter the helper, only rank 0 reaches the
gather. So each call of such a helper from another module, made on every rank of a
distributed script, is reported too, pointing at the collective it reaches (the fix is in
the helper, the place the run stops is the call). Calls in the helper's own module are
left to the helper's finding. Only a helper that reaches its collective on every call
counts: nothing but its rank test (and ``with`` blocks) stands between its first line and
the collective; one behind a setting (``if cfg.eval_batches > 0:``) or a loop hangs only
in the runs that take that path.

Example:
    >>> from pathlib import Path
    >>> import tempfile
    >>> from gpu_training.diagnostics.lint import lint_paths
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / ".git").mkdir()
    >>> _ = (root / "util.py").write_text(
    ...     "import torch.distributed as dist\\n"
    ...     "def sync(rank):\\n    if rank == 0:\\n        dist.barrier()\\n")
    >>> _ = (root / "train.py").write_text(
    ...     "import torch.distributed as dist\\nfrom util import sync\\n"
    ...     "dist.init_process_group('nccl')\\nsync(dist.get_rank())\\n")
    >>> sorted((Path(f.path).name, f.line) for f in lint_paths([root]).findings if f.code == "GT009")
    [('train.py', 4), ('util.py', 4)]
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.calls import node_start
from gpu_training.diagnostics.lint.context import RawFinding
from gpu_training.diagnostics.lint.guards import classify_guard
from gpu_training.diagnostics.lint.helper_writes import written_functions
from gpu_training.diagnostics.lint.model import ModuleFacts

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.checks import FileChecker

__all__ = ["call_site_collectives"]


def call_site_collectives(
    checkers: Mapping[str, FileChecker], results: Mapping[str, list[RawFinding] | str]
) -> dict[str, list[RawFinding]]:
    """The ``GT009`` findings to add at the calls of helpers that guard their collective.

    Args:
        checkers: Each linted file's checker, after its report.
        results: Each file's findings (or the reason it could not be analysed).

    Returns:
        Path → the findings to add there (calls of another file's function holding a
        ``GT009`` finding, made on every rank of a distributed script with no rank test).
    """
    guarded = written_functions(checkers, results, "GT009")
    added: dict[str, list[RawFinding]] = {}
    for path, checker in checkers.items():
        if not checker.distributed or isinstance(results.get(path), str):
            continue
        seen: set[int] = set()
        for (facts, func), ctx, every_rank, call in checker.outgoing:
            found = guarded.get(id(func))
            if found is None or facts.path == path or id(call) in seen:
                continue
            if not _reached_on_every_call(facts, func, found[1]):
                continue
            seen.add(id(call))
            if not every_rank or ctx.launcher or ctx.rank0 or ctx.others or ctx.rank_dep:
                continue  # under a rank test here: the caller's own GT009, if any
            line, col = node_start(call)
            name, at, _ = found
            detail = f"{func.name}() reaches a collective under its rank test ({name}:{at})"
            added.setdefault(path, []).append(RawFinding(line, col, "GT009", detail))
    return added


def _reached_on_every_call(facts: ModuleFacts, func: ast.AST, line: int) -> bool:
    """Whether the statement at ``line`` of ``func`` runs on each call on the ranks its
    rank tests admit: only ``with``/``try`` blocks and rank tests enclose it."""
    scope = facts.scope_of(func)
    body: list[ast.stmt] = list(getattr(func, "body", []))
    while True:
        stmt = next((s for s in body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if stmt is None or stmt.lineno == line:
            return stmt is not None
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            body = stmt.body
        elif isinstance(stmt, ast.Try):
            body = [*stmt.body, *stmt.finalbody]
        elif isinstance(stmt, ast.If) and classify_guard(facts, stmt.test, scope) is not None:
            body = [*stmt.body, *stmt.orelse]
        else:
            return False
