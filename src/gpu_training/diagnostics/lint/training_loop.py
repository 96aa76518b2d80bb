"""The training loop's shape: epochs over a loader, micro-batches, optimizer steps, the scaler.

The walk of :mod:`~gpu_training.diagnostics.lint.checks` meets loops, ``with`` blocks and
calls one at a time; the rules about the training loop need to know what surrounds them — is
this loop a gradient-accumulation loop (an optimizer step under ``if step % accum == 0``)? does
this ``with`` turn DDP's gradient sync off? did this function unscale the AMP scaler before it
clips? This module answers those questions and holds the rules built on them:

* gradient accumulation without ``no_sync()`` (``GT013``, :meth:`LoopAnalysis.is_accumulation_loop`
  and :func:`is_no_sync`);
* clipping before ``scaler.unscale_()`` (``GT012``, :meth:`LoopAnalysis.clips_before_unscale`);
* (an epoch loop without ``set_epoch``, ``GT005``, is
  :mod:`~gpu_training.diagnostics.lint.epochs`).

It is separate from the walk because these are questions about loop bodies and whole
functions (where is the optimizer step, where is the ``unscale_``), asked once and cached.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
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
import itertools

from gpu_training.diagnostics.lint.accumulation import backward_helper
from gpu_training.diagnostics.lint.bypassed_wrappers import trains_own_sharded_model
from gpu_training.diagnostics.lint.calls import enclosing_blocks, is_const, node_start, tail
from gpu_training.diagnostics.lint.launched_flags import launched_without_accumulation
from gpu_training.diagnostics.lint.micro_batches import stepped_by_callers, steps_handed_optimizer
from gpu_training.diagnostics.lint.model import (
    ModuleFacts,
    Scope,
    dotted,
    iter_scope_nodes,
)

__all__ = [
    "LoopAnalysis",
    "is_no_sync",
]


class LoopAnalysis:
    """Accumulation loops and AMP scaler use in one file, computed once per file.

    Args:
        facts: The file's facts.
    """

    def __init__(self, facts: ModuleFacts) -> None:
        self.facts = facts
        self._scaler_scopes = self._scaler_scope_info()
        self._accum_cache: dict[ast.stmt, bool] = {}
        self._sync_cache: dict[ast.stmt, bool] = {}
        self._following: dict[ast.stmt, list[ast.stmt]] | None = None

    def clips_before_unscale(self, call: ast.Call, scope: Scope) -> bool:
        """``GT012``: whether a clipping call comes after a ``scaler.scale()`` on its path and
        before any ``unscale_`` of its scaler.

        Only scopes that scale a loss with a ``GradScaler`` count. The scaled backward must
        come earlier in the clip's own block or an enclosing one (not in the other branch of
        an ``if amp: ... else: ...``); no ``unscale_`` may come earlier in the function.
        """
        unscales = self._scaler_scopes.get(scope.node)
        if unscales is None:
            return False
        if any(pos < node_start(call) for pos in unscales):
            return False
        body = getattr(scope.node, "body", [])
        blocks = enclosing_blocks(body, call)
        if self._scalerless_branch(blocks, scope):
            return False
        for block, index in blocks:
            for stmt in block[:index]:
                if any(self._is_scale(n, scope) for n in ast.walk(stmt)):
                    return True
        return False

    def _scalerless_branch(self, blocks: list[tuple[list[ast.stmt], int]], scope: Scope) -> bool:
        """The clip sits in the branch of an ``if`` that runs without the scaler: the ``else:``
        of ``if scaler is not None:`` / ``if scaler:``, or the body of ``if scaler is None:`` /
        ``if not scaler:``. Nothing is scaled there, so clipping before an ``unscale_`` is right."""
        for (block, index), (inner, _) in itertools.pairwise(blocks):
            stmt = block[index]
            if isinstance(stmt, ast.If) and any(
                "scaler" in self.facts.kinds(expr, scope) or "scaler" in tail(dotted(expr)).lower()
                for expr in _absent_in(stmt.test, in_orelse=inner is stmt.orelse)
            ):
                return True
        return False

    def _is_scale(self, node: ast.AST, scope: Scope) -> bool:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            return False
        receiver = node.func.value
        return node.func.attr == "scale" and (
            "scaler" in self.facts.kinds(receiver, scope)
            or "scaler" in tail(dotted(receiver)).lower()
        )

    def handles_sync(self, loop: ast.stmt, scope: Scope) -> bool:
        """Whether a loop manages DDP's gradient sync itself: a ``no_sync()``/``accumulate()``
        block anywhere in it, or nanoGPT's ``require_backward_grad_sync`` switch; or the
        function trains an FSDP model it wraps itself (no DDP all-reduce to skip)."""
        cached = self._sync_cache.get(loop)
        if cached is None:
            cached = trains_own_sharded_model(self.facts, scope)
            for node in iter_scope_nodes(getattr(loop, "body", [])):
                if isinstance(node, (ast.Assign, ast.AugAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(tail(dotted(t)) == "require_backward_grad_sync" for t in targets):
                        cached = True
                elif isinstance(node, (ast.With, ast.AsyncWith)) and any(
                    is_no_sync(item.context_expr, scope, self.facts) for item in node.items
                ):
                    cached = True
            self._sync_cache[loop] = cached
        return cached

    def accumulating_step(self, call: ast.Call, scope: Scope) -> str | None:
        """``GT013`` outside a loop: a per-batch method (a Trainer's ``train_step(batch, i)``)
        that backpropagates on every call and steps only under an accumulation test after it,
        with no ``no_sync()`` in the method; where it steps, or None."""
        func = scope.node
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        if self.handles_sync(func, scope):
            return None
        return self.accumulating_backward(func, call, scope)

    def accumulating_backward(self, loop: ast.stmt, call: ast.Call, scope: Scope) -> str | None:
        """``GT013``: whether a backward in an accumulation loop runs on micro-batches that do
        not step, and where the loop steps (``"optimizer.step() only if i % k == 0 (line 9)"``).

        A backward on a path that steps every iteration (the ``else`` of
        ``if accumulation_steps > 1:``) is not one.
        """
        if not self.is_accumulation_loop(loop, scope):
            return None
        if launched_without_accumulation(self.facts, loop):
            return None  # every shipped launch passes an accumulation count of 1
        if _engine_steps_after(call, loop):
            return None  # `engine.backward(loss); engine.step()`: the engine's accumulation
        for block, index in reversed(enclosing_blocks(getattr(loop, "body", []), call)):
            for at, stmt in enumerate(block[index + 1 :], index + 1):
                if isinstance(stmt, ast.Expr) and self._is_optimizer_step(stmt.value, scope):
                    return None  # this path steps on every micro-batch
                if isinstance(stmt, ast.If) and _is_accumulation_test(stmt.test):
                    found = self._step_under(stmt, scope) or self._step_after_skip(block, at, scope)
                    if found is not None:
                        return found
        return self.accumulation_step(loop, scope)

    def _step_after_skip(self, block: list[ast.stmt], index: int, scope: Scope) -> str | None:
        """``if step % k != 0: continue`` then ``optimizer.step()`` further down the block:
        the step runs only on the iterations the test lets through."""
        test = block[index]
        if not (isinstance(test, ast.If) and test.body and not test.orelse):
            return None
        if not isinstance(test.body[-1], ast.Continue):
            return None
        for sub in iter_scope_nodes(block[index + 1 :]):
            if self._is_optimizer_step(sub, scope):
                assert isinstance(sub, ast.Call)
                condition = ast.unparse(test.test)
                return f"{ast.unparse(sub.func)}() unless {condition} (line {test.lineno})"
        return None

    def _step_under(self, test: ast.If, scope: Scope) -> str | None:
        for sub in iter_scope_nodes(test.body):
            if self._is_optimizer_step(sub, scope):
                assert isinstance(sub, ast.Call)
                condition = ast.unparse(test.test)
                return f"{ast.unparse(sub.func)}() only if {condition} (line {test.lineno})"
        return None

    def accumulation_step(self, loop: ast.stmt, scope: Scope) -> str:
        """Where an accumulation loop steps: ``"optimizer.step() only if i % k == 0 (line 9)"``
        (a modulo test first, then any accumulation-named one)."""
        tests = [
            n
            for n in iter_scope_nodes(getattr(loop, "body", []))
            if isinstance(n, ast.If) and _is_accumulation_test(n.test)
        ]
        tests.sort(key=lambda n: not _is_boundary_test(n.test))
        for node in tests:
            found = self._step_under(node, scope)
            if found is not None:
                return found
        return "the optimizer steps every few micro-batches"

    def is_micro_batch_loop(self, loop: ast.stmt, scope: Scope) -> bool:
        """A loop that runs ``backward()`` several times and steps after it: the micro-batches
        of one optimizer step (``for micro in range(k): loss.backward()`` then ``step()``)."""
        if self.handles_sync(loop, scope) or not isinstance(loop, (ast.For, ast.While)):
            return False
        body = list(iter_scope_nodes(loop.body))
        if any(self._is_optimizer_step(n, scope) for n in body):
            return False
        if any(isinstance(n, ast.Call) and _engine_steps_after(n, loop) for n in body):
            return False  # `engine.backward(loss); engine.step()`: the engine steps each pass
        if not any(
            _is_backward(n) or (isinstance(n, ast.Call) and backward_helper(self.facts, n))
            for n in body
        ):  # `train_step(model, batch)` whose body runs the backward counts too
            return False
        if self._following is None:
            self._following = {}
            for node in self.facts.nodes:
                for name in ("body", "orelse", "finalbody"):
                    block = getattr(node, name, None)
                    if not isinstance(block, list):
                        continue
                    for index, stmt in enumerate(block):
                        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                            self._following[stmt] = block[index + 1 :]
        following = self._following.get(loop, [])
        if any(self._is_optimizer_step(n, scope) for n in iter_scope_nodes(following)):
            return True
        return stepped_by_callers(self.facts, loop, scope, self._steps)

    def _steps(self, node: ast.AST, scope: Scope) -> bool:
        """An optimizer step, or a call handing an optimizer to a function of the project
        that trains (``mp_trainer.optimize(opt)``)."""
        if self._is_optimizer_step(node, scope):
            return True
        if not isinstance(node, ast.Call):
            return False
        return steps_handed_optimizer(self.facts, node, scope)

    def accumulating_helper(self, call: ast.Call, scope: Scope) -> str | None:
        """``loss_scaler(loss, optimizer, update_grad=(i + 1) % k == 0)``: a helper that runs
        the backward on every call and steps only when told (MAE's, Swin's, DeiT's scalers).

        Returns:
            The evidence, or None: no argument of the call is an accumulation boundary, or the
            call does not hand it a loss.
        """
        passed = [(k.arg, k.value) for k in call.keywords] + [(None, a) for a in call.args]
        for name, value in passed:
            test = value
            if isinstance(value, ast.Name):
                bound = self.facts.lookup(value.id, scope, node_start(value))
                test = next((v for v in bound if v is not None), value)
            if not _is_boundary_test(test):
                continue
            takes_loss = any("loss" in ast.unparse(a).lower() for a in call.args[:1])
            if not takes_loss and not any(s.trains for s in self.facts.summaries(call)):
                continue
            shown = f"{name}={ast.unparse(value)}" if name else ast.unparse(value)
            callee = ast.unparse(call.func)
            return f"{callee}(..., {shown}) runs backward() on every micro-batch; no no_sync()"
        return None

    def no_sync_after_forward(
        self, stmt: ast.With | ast.AsyncWith, item: ast.withitem, scope: Scope
    ) -> tuple[ast.Call, str] | None:
        """``GT016``: a ``no_sync()`` block whose body runs a backward but no forward.

        Returns:
            ``(the backward call, evidence)``, or None: the block calls anything that may run
            the model (the model itself, a loss function, a helper).
        """
        calls = [n for n in iter_scope_nodes(stmt.body) if isinstance(n, ast.Call)]
        backward = next((c for c in calls if _is_backward(c)), None)
        if backward is None or any(_may_forward(c) for c in calls):
            return None
        loss = backward.args[0] if backward.args else None
        if isinstance(backward.func, ast.Attribute) and not backward.args:
            loss = backward.func.value
            while isinstance(loss, ast.Call) and isinstance(loss.func, ast.Attribute):
                loss = loss.args[0] if loss.args else loss.func.value  # scaler.scale(loss)
        origin = ""
        if isinstance(loss, ast.Name):
            bound = [
                v for v in self.facts.lookup(loss.id, scope, node_start(stmt)) if v is not None
            ]
            if bound:
                origin = f"; {loss.id} is computed at line {bound[-1].lineno}, before the block"
        context = ast.unparse(item.context_expr)
        return backward, f"with {context} holds only the backward{origin}"

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
            if isinstance(node, ast.If) and (
                _is_accumulation_test(node.test) or _is_counter_boundary(node, body)
            ):
                for sub in iter_scope_nodes(node.body):
                    if self._is_optimizer_step(sub, scope):
                        result = True
        else:  # `if step % k != 0: continue` in the loop's own body, the step after it
            result = result or any(
                isinstance(stmt, ast.If)
                and _is_accumulation_test(stmt.test)
                and self._step_after_skip(body, at, scope) is not None
                for at, stmt in enumerate(body)
            )
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
        if kinds & {"optimizer", "scaler", "amp_stepper"}:
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


_SYNC_CONTEXTS = frozenset({"no_sync", "gradient_sync", "accumulate", "no_backward_sync"})
# Calls inside a `with no_sync():` block that cannot run the model's forward.
_NO_FORWARD = frozenset(
    {
        "backward",
        "scale",
        "item",
        "detach",
        "mean",
        "sum",
        "div",
        "div_",
        "mul",
        "float",
        "clone",
        "append",
        "update",
        "unscale_",
        "zero_grad",
        "cpu",
        "numpy",
        "size",
        "len",
        "print",
        "isinstance",
        "isfinite",
        "is_finite",
        "synchronize",
    }
)


def _syncs(expr: ast.AST) -> bool:
    """``model.no_sync()``, ``accelerator.accumulate(model)``, or ``model.no_sync`` itself."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and tail(dotted(node.func)) in _SYNC_CONTEXTS:
            return True
        if isinstance(node, ast.Attribute) and node.attr in _SYNC_CONTEXTS:
            return True
    return False


def _engine_steps_after(call: ast.Call, loop: ast.stmt) -> bool:
    """``model.backward(loss)`` whose receiver also ``step()``s later in the loop: an engine
    (DeepSpeed's, or any object that takes the loss and steps itself), not a module. An
    ``nn.Module`` has no ``backward``; an engine holds its own accumulation boundary (it
    reduces gradients and updates only at the end of its ``gradient_accumulation_steps``), so
    no ``no_sync()`` is missing. ``loss.backward()`` (no argument) is a tensor's."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "backward" and call.args):
        return False
    receiver = dotted(call.func.value)
    return receiver is not None and any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "step"
        and dotted(node.func.value) == receiver
        and node_start(node) > node_start(call)
        for node in ast.walk(loop)
    )


def _is_backward(node: ast.AST) -> bool:
    """``loss.backward()``, ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "backward"
    )


def _may_forward(call: ast.Call) -> bool:
    """Whether a call may run the model: anything but a few tensor and bookkeeping methods."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr not in _NO_FORWARD
    if isinstance(call.func, ast.Name):
        return call.func.id not in _NO_FORWARD
    return True


def _is_boundary_test(expr: ast.expr) -> bool:
    """``(i + 1) % accum == 0``, ``should_step(i, k)``: true on the last micro-batch only."""
    if isinstance(expr, ast.Call):
        return tail(dotted(expr.func)) == "should_step"
    if isinstance(expr, ast.BoolOp):
        return any(_is_boundary_test(v) for v in expr.values)
    return isinstance(expr, ast.Compare) and any(
        isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(expr)
    )


def _absent_in(test: ast.expr, *, in_orelse: bool) -> list[ast.expr]:
    """The values a branch of ``if test:`` runs without: ``x`` in the ``else:`` of
    ``if x is not None:`` / ``if x:``, in the body of ``if x is None:`` / ``if not x:``."""
    if in_orelse:
        if isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.IsNot):
            return [test.left] if is_const(test.comparators[0], None) else []
        return [test] if isinstance(test, (ast.Name, ast.Attribute)) else []
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    found: list[ast.expr] = []
    for part in parts:
        if isinstance(part, ast.Compare) and isinstance(part.ops[0], ast.Is):
            found += [part.left] if is_const(part.comparators[0], None) else []
        elif isinstance(part, ast.UnaryOp) and isinstance(part.op, ast.Not):
            found.append(part.operand)
    return found


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


def _is_counter_boundary(branch: ast.If, loop_body: list[ast.stmt]) -> bool:
    """``if count == 8: ...; count = 0`` with ``count += 1`` in the loop: a counter of
    micro-batches the branch resets, true once every N iterations (N a name, or a constant
    above 1), the way a modulo test is."""
    test = branch.test
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Eq, ast.GtE))
    ):
        return False
    counter = dotted(test.left)
    limit = test.comparators[0]
    if counter is None or (
        isinstance(limit, ast.Constant) and not (isinstance(limit.value, int) and limit.value > 1)
    ):
        return False
    resets = any(
        isinstance(node, ast.Assign)
        and is_const(node.value, 0)
        and any(dotted(t) == counter for t in node.targets)
        for node in iter_scope_nodes(branch.body)
    )
    return resets and any(_counts_up(node, counter) for node in iter_scope_nodes(loop_body))


def _counts_up(node: ast.AST, counter: str) -> bool:
    """``counter += 1`` or ``counter = counter + 1``."""
    if isinstance(node, ast.AugAssign):
        return isinstance(node.op, ast.Add) and dotted(node.target) == counter
    return (
        isinstance(node, ast.Assign)
        and any(dotted(t) == counter for t in node.targets)
        and isinstance(node.value, ast.BinOp)
        and isinstance(node.value.op, ast.Add)
        and dotted(node.value.left) == counter
    )


def is_no_sync(expr: ast.expr, scope: Scope, facts: ModuleFacts) -> bool:
    """Whether a ``with`` item turns gradient sync off (``model.no_sync()``, ``gradient_sync``).

    A name is followed to what it was bound to (``ctx = model.no_sync() if ... else ...``).
    """
    exprs: list[ast.AST] = [expr]
    if isinstance(expr, ast.Name):
        exprs += [v for v in facts.lookup(expr.id, scope, node_start(expr)) if v is not None]
    if isinstance(expr, ast.Call) and isinstance(
        expr.func, ast.Name
    ):  # `ctx = m.no_sync ...; with ctx():`
        exprs += [v for v in facts.lookup(expr.func.id, scope, node_start(expr)) if v is not None]
    return any(_syncs(item) for item in exprs)
