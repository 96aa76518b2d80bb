"""``GT013``: a DDP model's backward that all-reduces on every micro-batch of an accumulation
window, found by :class:`~gpu_training.diagnostics.lint.checks.FileChecker`'s walk.

Each function reports through ``checker.add``; what an accumulation loop is and whether it
switches the synchronisation off is :class:`~gpu_training.diagnostics.lint.training_loop.LoopAnalysis`'s
call. The fix named is the framework's own (``accelerator.accumulate()``,
``fabric.no_backward_sync()``), else DDP's ``no_sync()``.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpu_training.diagnostics.lint.context import Ctx
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope

if TYPE_CHECKING:
    from gpu_training.diagnostics.lint.checks import FileChecker

__all__ = ["backward_helper", "every_micro_batch", "every_step_call"]

# What a helper that only backpropagates does not call: a step, or its own synchronisation switch.
_STEPPING = frozenset({"step", "zero_grad", "no_sync", "accumulate", "no_backward_sync"})
_NO_SYNC = {"accelerate": "accelerator.accumulate()", "fabric": "fabric.no_backward_sync()"}


def _missing(checker: FileChecker, call: ast.Call) -> tuple[str, str]:
    """The backward as written and the fix the file's framework names."""
    return f"{ast.unparse(call.func)}()", _NO_SYNC.get(checker.framework or "", "no_sync()")


def every_step_call(checker: FileChecker, call: ast.Call, scope: Scope) -> None:
    """``GT013`` in a per-batch method a loop elsewhere calls (a Trainer's ``train_step``):
    see :meth:`~gpu_training.diagnostics.lint.training_loop.LoopAnalysis.accumulating_step`."""
    step = checker.training_loop.accumulating_step(call, scope)
    if step is not None:
        backward, missing = _missing(checker, call)
        checker.add(call, "GT013", f"{backward} on every call; {step}; no {missing}")


def every_micro_batch(
    checker: FileChecker, call: ast.Call, ctx: Ctx, scope: Scope, method: str | None
) -> None:
    """``GT013``: a backward of a DDP model, in a loop, that all-reduces on every micro-batch
    (the backward written in the loop, or a helper of the project that runs it)."""
    if method != "backward" and backward_helper(checker.facts, call):
        method = "backward"
    loop = ctx.loops[-1]
    training_loop = checker.training_loop
    if training_loop.handles_sync(loop, scope):
        return
    step = training_loop.accumulating_backward(loop, call, scope) if method == "backward" else None
    backward, missing = _missing(checker, call)
    if step is not None:
        checker.add(call, "GT013", f"{backward} on every micro-batch; {step}; no {missing}")
    elif method == "backward" and any(
        training_loop.is_micro_batch_loop(outer, scope) for outer in ctx.loops
    ):
        why = f"{backward} in a micro-batch loop, one optimizer step after it; no {missing}"
        checker.add(call, "GT013", why)
    else:
        helper = training_loop.accumulating_helper(call, scope)
        if helper is not None:
            checker.add(call, "GT013", helper)


def backward_helper(facts: ModuleFacts, call: ast.Call) -> bool:
    """A call of a function of the project that runs ``backward()`` and neither steps nor
    switches the synchronisation off (``self._backward(loss)`` with ``loss = loss / k;
    loss.backward()``): in an accumulation loop it is the micro-batch's backward.

    Example:
        >>> src = ("def back(loss):\\n    (loss / 4).backward()\\n"
        ...        "for i, b in enumerate(dl):\\n    back(model(b))\\n")
        >>> facts = ModuleFacts(ast.parse(src))
        >>> backward_helper(facts, facts.tree.body[1].body[0].value)
        True
    """
    callees = facts.callees(call)
    if not callees:
        return False
    for _owner, func in callees:
        methods = {
            n.func.attr
            for n in ast.walk(func)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        }
        if "backward" not in methods or methods & _STEPPING:
            return False
    return True
