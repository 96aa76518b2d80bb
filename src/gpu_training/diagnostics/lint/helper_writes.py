"""``GT007`` at each call, in a distributed script, of another module's function that writes.

A write inside a helper of another module (``save_config(args)`` in ``utils.py``, opening a
fixed path with ``"w"``) is reported once, in the helper, when some caller runs it on every
rank. But every script that calls the helper outside a rank-0 guard is a run in which all the
ranks write that file: the bug is the call, and so is the fix (guard it, or guard the
helper). So the call of each such script is reported too, pointing at the write it reaches.
Calls in the helper's own module are left to the helper's finding (the same file, one
place to fix).

Example:
    >>> from pathlib import Path
    >>> import tempfile
    >>> from gpu_training.diagnostics.lint import lint_paths
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / ".git").mkdir()
    >>> _ = (root / "util.py").write_text(
    ...     "def dump(cfg):\\n    with open('run.yaml', 'w') as f:\\n        f.write(cfg)\\n")
    >>> _ = (root / "train.py").write_text(
    ...     "import torch.distributed as dist\\nfrom util import dump\\n"
    ...     "dist.init_process_group('nccl')\\ndump('x')\\n")
    >>> sorted((Path(f.path).name, f.line) for f in lint_paths([root]).findings if f.code == "GT007")
    [('train.py', 4), ('util.py', 2)]
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.calls import node_start
from gpu_training.diagnostics.lint.context import Ctx, RawFinding

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.checks import FileChecker

__all__ = ["call_site_writes", "innermost_function", "written_functions"]

_Func = ast.FunctionDef | ast.AsyncFunctionDef


def innermost_function(tree: ast.AST, line: int) -> _Func | None:
    """The innermost function whose lines hold ``line``."""
    found: _Func | None = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end and (found is None or node.lineno >= found.lineno):
                found = node
    return found


def written_functions(
    checkers: Mapping[str, FileChecker], results: Mapping[str, list[RawFinding] | str], code: str
) -> dict[int, tuple[str, int, str]]:
    """The functions holding a finding of one rule, each with where its first one is.

    Args:
        checkers: Each linted file's checker, after its report.
        results: Each file's findings (or the reason it could not be analysed).
        code: The rule (``"GT007"``, ``"GT017"``).

    Returns:
        ``id(function)`` → (its file's name, the finding's line, the detail's first word).
    """
    writes: dict[int, tuple[str, int, str]] = {}
    for path, found in results.items():
        checker = checkers.get(path)
        if isinstance(found, str) or checker is None:
            continue
        for finding in found:
            if finding.code != code:
                continue
            func = innermost_function(checker.tree, finding.line)
            if func is not None and id(func) not in writes:
                what = finding.detail.split(" ", 1)[0]
                writes[id(func)] = (Path(path).name, finding.line, what)
    return writes


def _unrestricted(ctx: Ctx) -> bool:
    """No rank test of any kind keeps the call from some rank."""
    return not (ctx.rank0 or ctx.others or ctx.rank_dep or ctx.one_rank or ctx.local_only)


def call_site_writes(
    checkers: Mapping[str, FileChecker], results: Mapping[str, list[RawFinding] | str]
) -> dict[str, list[RawFinding]]:
    """The ``GT007`` findings to add at the calls of helpers whose writes every rank makes.

    Args:
        checkers: Each linted file's checker, after its report.
        results: Each file's findings (or the reason it could not be analysed).

    Returns:
        Path → the findings to add there (calls of another file's writing function, made
        on every rank of a distributed script outside any rank test).
    """
    writes = written_functions(checkers, results, "GT007")
    added: dict[str, list[RawFinding]] = {}
    for path, checker in checkers.items():
        if not checker.distributed or isinstance(results.get(path), str):
            continue
        seen: set[int] = set()
        for (facts, func), ctx, every_rank, call in checker.outgoing:
            write = writes.get(id(func))
            if write is None or facts.path == path or id(call) in seen:
                continue
            seen.add(id(call))
            name, at, what = write
            if not every_rank or not _unrestricted(ctx) or ctx.launcher:
                continue
            if ctx.prelaunch and "download" in what:  # once, before Fabric starts the others
                continue
            line, col = node_start(call)
            detail = f"{func.name} runs {what} ({name}:{at}) on every rank: no rank-0 guard"
            added.setdefault(path, []).append(RawFinding(line, col, "GT007", detail))
    return added
