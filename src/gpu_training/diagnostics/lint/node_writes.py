"""``GT017``: writes made by local rank 0 of every node, where they run and where they are called.

A write under a node-local guard (``if local_rank == 0:``) is made by one process of every
node, all to the same path on a shared filesystem. Two refinements of where that is reported:

* :func:`node_local_write` — the write itself (a ``shutil`` copy's destination too), unless
  its path names the node (one file per node) or the node's own disk (:mod:`.node_paths`:
  ``$SLURM_TMPDIR``, ``/tmp``), or it sits in a module-level function that nothing in the project names (never
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
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.calls import node_start
from gpu_training.diagnostics.lint.context import Ctx, RawFinding, names_node
from gpu_training.diagnostics.lint.helper_writes import written_functions
from gpu_training.diagnostics.lint.hf_launch import written_for_a_launch
from gpu_training.diagnostics.lint.locality import FLAG_NAMES
from gpu_training.diagnostics.lint.micro_batches import named_anywhere
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted
from gpu_training.diagnostics.lint.node_paths import copied_to, node_local_disk
from gpu_training.diagnostics.lint.rank_values import rank_in_value
from gpu_training.diagnostics.lint.stamped_paths import process_stamped

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.checks import FileChecker

__all__ = ["call_site_node_writes", "node_local_write", "several_processes"]


def node_local_write(
    call: ast.Call, ctx: Ctx, scope: Scope, facts: ModuleFacts, written: str | None
) -> str | None:
    """What a call writes on local rank 0 of every node, to one path for all of them.

    Args:
        call: The call.
        ctx: Its context (``local_only``: rank 0 by node-local guards only).
        scope: The function it is in.
        facts: Its module's facts.
        written: What it writes as ``GT007`` reads it (``"save"``, ``"open"``), or None:
            then a ``shutil`` copy's destination is the write.

    Returns:
        What is written, for a node-local write to a shared path in code that runs; None
        for a path that names the node or lies on the node's own disk (``$SLURM_TMPDIR``).
    """
    if not ctx.local_only:
        return None
    if written is None:
        target = copied_to(call, facts)
        if target is None or facts.mentions_rank(call) or rank_in_value(facts, target, scope):
            return None
        written = ast.unparse(call.func)
    if names_node(call, facts) or node_local_disk(facts, call, scope):
        return None
    if process_stamped(facts, call, scope):
        return None  # `"logs/" + str(datetime.now())`: each node's writer has its own path
    return written if named_anywhere(facts, _outermost(scope).node) else None


def several_processes(call: ast.Call, ctx: Ctx, scope: Scope, facts: ModuleFacts) -> bool:
    """Whether a call under a node-local guard, in code no process group of its file reaches,
    still runs in several processes: the file is written for a launcher (it reads
    ``LOCAL_RANK``, or the repository's scripts start it with ``deepspeed``/``torchrun``), or
    the guard is a framework's per-process flag (``state.is_local_process_zero``,
    ``trainer.is_local_process_zero()``), which exists because the framework runs the code
    once per GPU, or the code is a function or class another module of the project imports
    (its importers' processes run it, and the guard says there are several). An argument
    ``--local_rank`` that defaults to 0 in a script nothing
    launches is a leftover: that script runs one process."""
    if not ctx.local_only:
        return False
    if written_for_a_launch(facts) or _imported_elsewhere(facts, _outermost(scope).node):
        return True
    enclosing = [
        node
        for node in facts.scope_nodes.get(scope.node, [])
        if isinstance(node, ast.If) and node.lineno < call.lineno <= (node.end_lineno or 0)
    ]
    return any(
        _framework_local_flag(facts, sub, scope)
        for node in enclosing
        for sub in ast.walk(node.test)
    )


def _imported_elsewhere(facts: ModuleFacts, outer: ast.AST) -> bool:
    """A module-level function or class that another linted module imports from this one
    (``from pkg.vanilla import VanillaTrainer``, ``import pkg.utils`` then ``utils.save``)."""
    if not isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return False
    wanted = f"{Path(facts.path).stem}.{outer.name}"
    for module in getattr(facts.resolver, "linted", {}).values():
        if module is not facts and any(
            q == wanted or q.endswith("." + wanted) for q in _imported(module)
        ):
            return True
    return False


def _imported(module: ModuleFacts) -> frozenset[str]:
    """The qualified names a module imports or reads off an imported module, built once."""
    cached = module.memo.get("node-writes-imported")
    if isinstance(cached, frozenset):
        return cached
    found = {q for q in module.imports.names.values() if "." in q}
    for node in module.nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            base = module.imports.names.get(node.value.id)
            if base is not None:  # `utils.save` after `from pkg import utils`
                found.add(f"{base}.{node.attr}")
    result = frozenset(found)
    module.memo["node-writes-imported"] = result
    return result


def _framework_local_flag(facts: ModuleFacts, node: ast.AST, scope: Scope) -> bool:
    """``owner.is_local_…`` (a rank-0 flag of the node) that nothing in the file assigns."""
    if not isinstance(node, ast.Attribute) or "local" not in node.attr:
        return False
    if not FLAG_NAMES.match(node.attr.lower()):
        return False
    key = dotted(node)
    return key is not None and not facts.lookup(key, scope, (node.lineno, node.col_offset))


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
