"""The training loop's shape: epochs over a loader, micro-batches, optimizer steps, the scaler.

The walk of :mod:`~gpu_training.diagnostics.lint_checks` meets loops, ``with`` blocks and
calls one at a time; the rules about the training loop need to know what surrounds them — is
this loop a gradient-accumulation loop (an optimizer step under ``if step % accum == 0``)? does
this ``with`` turn DDP's gradient sync off? did this function unscale the AMP scaler before it
clips? This module answers those questions and holds the rules built on them:

* gradient accumulation without ``no_sync()`` (``GT013``, :meth:`LoopAnalysis.is_accumulation_loop`
  and :func:`is_no_sync`);
* clipping before ``scaler.unscale_()`` (``GT012``, :meth:`LoopAnalysis.clips_before_unscale`);
* a ``GradScaler`` in a bfloat16-only file (``GT011``, :func:`scalers_with_bf16`);
* an epoch loop over a shuffling distributed sampler's loader without ``set_epoch``
  (``GT005``, :func:`iterates_loader` and :func:`loops_without_set_epoch`).

It is separate from the walk because these are questions about loop bodies and whole
functions (where is the optimizer step, where is the ``unscale_``), asked once and cached.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint_model import ModuleFacts
    >>> tree = ast.parse("for i, batch in enumerate(loader):\\n"
    ...                  "    model(batch).backward()\\n"
    ...                  "    if i % accum == 0:\\n"
    ...                  "        optimizer.step()\\n")
    >>> facts = ModuleFacts(tree)
    >>> LoopAnalysis(facts).is_accumulation_loop(tree.body[0], facts.module_scope)
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint_calls import call_arg, is_const, keyword_arg, node_start, tail
from gpu_training.diagnostics.lint_model import (
    Imports,
    ModuleFacts,
    Scope,
    call_name,
    dotted,
    iter_scope_nodes,
)

__all__ = [
    "LoopAnalysis",
    "is_no_sync",
    "iterates_loader",
    "loops_without_set_epoch",
    "scalers_with_bf16",
]

_NO_SYNC_CALLS = frozenset({"no_sync", "gradient_sync", "accumulate"})


class LoopAnalysis:
    """Accumulation loops and AMP scaler use in one file, computed once per file.

    Args:
        facts: The file's facts.
    """

    def __init__(self, facts: ModuleFacts) -> None:
        self.facts = facts
        self._scaler_scopes = self._scaler_scope_info()
        self._accum_cache: dict[ast.stmt, bool] = {}

    def clips_before_unscale(self, call: ast.Call, scope: Scope) -> bool:
        """``GT012``: whether a clipping call comes before any ``unscale_`` of its scaler.

        Only scopes that scale a loss with a ``GradScaler`` count; the check is by position in
        the function (no ``unscale_`` earlier in the source).
        """
        unscales = self._scaler_scopes.get(scope.node)
        if unscales is None:
            return False
        return not any(pos < node_start(call) for pos in unscales)

    def is_accumulation_loop(self, loop: ast.stmt, scope: Scope) -> bool:
        """Whether a loop steps the optimizer only on some iterations (gradient accumulation).

        A loop that flips DDP's ``require_backward_grad_sync`` itself (nanoGPT) is not: its
        author handles the sync.
        """
        cached = self._accum_cache.get(loop)
        if cached is not None:
            return cached
        result = False
        body = getattr(loop, "body", [])
        for node in iter_scope_nodes(body):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(tail(dotted(t)) == "require_backward_grad_sync" for t in targets):
                    result = False  # nanoGPT's manual switch: the author handles the sync
                    break
            if isinstance(node, ast.If) and _is_accumulation_test(node.test):
                for sub in iter_scope_nodes(node.body):
                    if self._is_optimizer_step(sub, scope):
                        result = True
        self._accum_cache[loop] = result
        return result

    def _is_optimizer_step(self, node: ast.AST, scope: Scope) -> bool:
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "step"
        ):
            return False
        receiver = node.func.value
        kinds = self.facts.kinds(receiver, scope)
        if kinds & {"optimizer", "scaler", "amp_trainer"}:
            return True
        label = tail(dotted(receiver)).lower()
        return "sched" not in label and ("opt" in label or "scaler" in label)

    def _scaler_scope_info(self) -> dict[ast.AST, list[tuple[int, int]]]:
        """Scopes that use a GradScaler, with the positions of their ``unscale_`` calls."""
        info: dict[ast.AST, list[tuple[int, int]]] = {}
        for node, scope in self.facts.scopes.items():
            uses_scaler = False
            unscales = []
            for sub in self.facts.scope_nodes.get(node, []):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
                    receiver = sub.func.value
                    if sub.func.attr == "unscale_":
                        unscales.append(node_start(sub))
                    elif sub.func.attr == "scale" and (
                        "scaler" in self.facts.kinds(receiver, scope)
                        or "scaler" in tail(dotted(receiver)).lower()
                    ):
                        uses_scaler = True
            if uses_scaler:
                info[node] = unscales
        return info


def _is_accumulation_test(test: ast.expr) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return True
        if isinstance(node, ast.Call) and tail(dotted(node.func)) == "should_step":
            return True
        name = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if name is not None and ("accum" in name.lower() or "boundary" in name.lower()):
            return True
    return False


def is_no_sync(expr: ast.expr, scope: Scope, facts: ModuleFacts) -> bool:
    """Whether a ``with`` item turns gradient sync off (``model.no_sync()``, ``gradient_sync``).

    A name is followed to what it was bound to (``ctx = model.no_sync() if ... else ...``).
    """
    exprs: list[ast.AST] = [expr]
    if isinstance(expr, ast.Name):
        exprs += [v for v in facts.lookup(expr.id, scope, node_start(expr)) if v is not None]
    for item in exprs:
        for node in ast.walk(item):
            if isinstance(node, ast.Call) and tail(dotted(node.func)) in _NO_SYNC_CALLS:
                return True
    return False


def iterates_loader(expr: ast.expr, scope: Scope, facts: ModuleFacts) -> bool:
    """Whether a ``for`` loop's iterable is a data loader (through ``enumerate``, ``tqdm``…)."""
    while (
        isinstance(expr, ast.Call)
        and expr.args
        and tail(dotted(expr.func))
        in (
            "enumerate",
            "tqdm",
            "iter",
            "zip",
            "islice",
        )
    ):
        expr = expr.args[0]
    if "loader" in facts.kinds(expr, scope):
        return True
    return "loader" in tail(dotted(expr)).lower()


def loops_without_set_epoch(
    epoch_loops: list[ast.stmt], calls: list[ast.Call], tails: set[str], imports: Imports
) -> list[ast.stmt]:
    """``GT005``: the epoch loops to report when a shuffling sampler never gets ``set_epoch``.

    Args:
        epoch_loops: The loops around a loop over a loader, in walk order (repeats allowed).
        calls: Every call of the file.
        tails: The last names of every callee of the file.
        imports: The file's imports.

    Returns:
        The epoch loops, once each, when a distributed sampler shuffles and neither
        ``set_epoch`` nor ``train_one_epoch`` is called anywhere; else nothing.
    """
    shuffled = False
    for call in calls:
        last = tail(call_name(call, imports))
        if last in ("DistributedSampler", "make_distributed_sampler", "GlobalBatchSampler"):
            index = {"DistributedSampler": 3, "make_distributed_sampler": 2}.get(last, 99)
            shuffled = shuffled or not is_const(call_arg(call, index, "shuffle"), False)
    handled = tails & {"set_epoch", "train_one_epoch"}
    if shuffled and not handled:
        return list(dict.fromkeys(epoch_loops))
    return []


def scalers_with_bf16(calls: list[ast.Call], facts: ModuleFacts) -> list[ast.Call]:
    """``GT011``: the enabled ``GradScaler`` calls of a file whose every autocast is bfloat16.

    Args:
        calls: Every call of the file.
        facts: The file's facts.

    Returns:
        The scaler constructions to report (none unless every ``autocast`` is bfloat16).
    """
    dtypes: set[str] = set()
    for call in calls:
        if tail(call_name(call, facts.imports)) != "autocast":
            continue
        dtype = keyword_arg(call, "dtype")
        if (
            dtype is None
            and len(call.args) > 1
            and "torch.autocast" in call_name(call, facts.imports)
        ):
            dtype = call.args[1]
        dtypes.add(_dtype_name(dtype, facts))
    if dtypes != {"bfloat16"}:
        return []
    found = []
    for call in calls:
        if tail(call_name(call, facts.imports)) in ("GradScaler", "ShardedGradScaler"):
            enabled = keyword_arg(call, "enabled")
            if enabled is None or is_const(enabled, True):
                found.append(call)
    return found


def _dtype_name(expr: ast.expr | None, facts: ModuleFacts) -> str:
    if expr is None:
        return "default"
    name = facts.imports.resolve(dotted(expr))
    if isinstance(expr, ast.Name) and name == expr.id:
        values = [v for s in facts.scopes.values() for _, v in s.bindings.get(expr.id, [])]
        resolved = {facts.imports.resolve(dotted(v)) for v in values if v is not None}
        if len(resolved) == 1:
            name = resolved.pop()
    last = tail(name)
    return {"half": "float16", "bf16": "bfloat16"}.get(last, last or "unknown")
