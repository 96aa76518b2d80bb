"""What a node-local write writes, and paths that live on the node's own disk (``GT017``).

* :func:`copied_to` — ``shutil.copy(src, dst)`` and its kin write ``dst``: a copy of the
  config into the run directory under ``if local_rank == 0:`` is one writer per node, as a
  ``torch.save`` there is.
* :func:`node_local_disk` — a path on storage each node has for itself: under a directory an
  environment variable names as scratch, temporary or local space (``$LSCRATCH``,
  ``$SLURM_TMPDIR``, ``$TMPDIR``, ``$LOCAL_DIR``), or a literal under ``/tmp``, ``/dev/shm``,
  ``/local`` or ``/scratch_local``. One process per node writing there is the intended
  pattern (stage the data set onto each node), not a race. A parameter is followed to what
  every caller passes, and ``args.<option>`` to its command-line default
  (:mod:`~gpu_training.diagnostics.lint.passed_paths`).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = "import os, shutil\\nshutil.copy(cfg, os.environ['SLURM_TMPDIR'])\\n"
    >>> facts = ModuleFacts(ast.parse(src))
    >>> call = facts.calls[-1]
    >>> ast.unparse(copied_to(call, facts)), node_local_disk(facts, call, facts.module_scope)
    ("os.environ['SLURM_TMPDIR']", True)
"""

from __future__ import annotations

import ast
import re

from gpu_training.diagnostics.lint.calls import call_arg, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.passed_paths import option_default, passed_values

__all__ = ["copied_to", "node_local_disk"]

_COPIES = frozenset({"copy", "copy2", "copyfile", "copytree", "move"})
_LOCAL_SPACE = re.compile(r"SCRATCH|TMP|TEMP|^LOCAL_?(DIR|DISK|PATH|STORAGE|SSD)")
_LOCAL_ROOTS = ("/tmp", "/dev/shm", "/local/", "/scratch_local", "/var/tmp")
_MAX_DEPTH = 3


def copied_to(call: ast.Call, facts: ModuleFacts) -> ast.expr | None:
    """The destination a ``shutil`` copy or move writes, or None (not such a call)."""
    name = call_name(call, facts.imports)
    if not name.startswith("shutil.") or tail(name) not in _COPIES:
        return None
    return call_arg(call, 1, "dst")


def node_local_disk(facts: ModuleFacts, expr: ast.AST, scope: Scope, depth: int = 0) -> bool:
    """Whether a path (or any argument of a writing call) is on the node's own storage:
    read from a scratch/temporary/local-space environment variable or a literal local root,
    directly or through a name bound to one."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _LOCAL_SPACE.search(node.value) and _is_env_key(facts, node, expr):
                return True
            if node.value.startswith(_LOCAL_ROOTS):
                return True
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and depth < _MAX_DEPTH:
            values = [v for v in facts.lookup_all(node.id, scope) if v is not None]
            if any(node_local_disk(facts, v, scope, depth + 1) for v in values):
                return True
            passed = None if values else passed_values(facts, node.id, scope)  # a parameter
            if passed and all(node_local_disk(m, v, s, depth + 1) for m, v, s in passed):
                return True
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            default = option_default(facts, node.attr)  # `args.cache_dir`, default="/tmp/..."
            if default is not None and node_local_disk(facts, default, scope, depth + 1):
                return True
    return False


def _is_env_key(facts: ModuleFacts, key: ast.Constant, within: ast.AST) -> bool:
    """``os.environ[KEY]``, ``os.environ.get(KEY)`` or ``os.getenv(KEY)`` around ``key``."""
    for node in ast.walk(within):
        if isinstance(node, ast.Subscript) and node.slice is key:
            return facts.imports.resolve(dotted(node.value)) == "os.environ"
        if isinstance(node, ast.Call) and node.args and node.args[0] is key:
            return call_name(node, facts.imports) in ("os.getenv", "os.environ.get")
    return False
