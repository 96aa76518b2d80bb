"""``GT014``: the trained model's parameters overwritten on some ranks only, mid-training.

Every replica of a data-parallel model holds the same weights because every rank applies the
same averaged update; DDP broadcasts the parameters once, when it wraps the model, and never
again. So a write to the weights under a rank guard, inside the training loop, splits the
replicas for the rest of the run, silently: the loss still goes down on each. The pattern
measured on held-back set 24 (``benchmarks/lint_heldout24_truth.csv``): at each checkpoint,
``if accelerator.is_main_process: ... ema_unet.copy_to(unet.parameters())`` copies the EMA
weights into rank 0's training UNet (three scripts of one repository, launched on 8 GPUs).

Reported: ``ema.copy_to(model.parameters())`` under a rank guard, inside a loop that trains
(:func:`~gpu_training.diagnostics.lint.epochs.loop_trains`), unless a later statement of a
block of that loop holding it puts the weights back (``ema.restore(model.parameters())``,
diffusers' store / copy_to / restore for a validation with the EMA weights). After the loop (the usual "save the EMA weights at the end")
nothing trains any more, and nothing is reported.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse(
    ...     "for batch in loader:\\n"
    ...     "    loss.backward()\\n"
    ...     "    if rank == 0:\\n"
    ...     "        ema.copy_to(model.parameters())\\n"
    ... )
    >>> facts = ModuleFacts(tree)
    >>> call = tree.body[0].body[1].body[0].value
    >>> overwritten_parameters(call, facts)
    'ema.copy_to(model.parameters()) mid-training'
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import enclosing_blocks, parents
from gpu_training.diagnostics.lint.epochs import loop_trains
from gpu_training.diagnostics.lint.model import ModuleFacts, dotted

__all__ = ["overwritten_parameters"]


def overwritten_parameters(call: ast.Call, facts: ModuleFacts) -> str | None:
    """What a call under a rank guard overwrites of the trained model, or None.

    Args:
        call: A ``copy_to`` call (under a rank guard of its function).
        facts: Its module's facts.

    Returns:
        The detail to report (``"ema.copy_to(unet.parameters()) mid-training"``), or None.
    """
    if not isinstance(call.func, ast.Attribute):
        return None
    model = _overwritten_model(call)
    if model is None:
        return None
    held = parents(facts)
    loop: ast.AST | None = held.get(id(call))
    while loop is not None and not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
        if isinstance(loop, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return None  # not in a loop of its own function
        loop = held.get(id(loop))
    if loop is None or not loop_trains(facts, loop):
        return None
    blocks = enclosing_blocks(getattr(loop, "body", []), call)
    if any(_restores(later, model) for block, at in blocks for later in block[at + 1 :]):
        return None
    receiver = dotted(call.func.value) or "ema"
    return f"{receiver}.copy_to({model}.parameters()) mid-training"


def _overwritten_model(call: ast.Call) -> str | None:
    """``unet`` for ``ema.copy_to(unet.parameters())``."""
    assert isinstance(call.func, ast.Attribute)
    if call.func.attr != "copy_to":
        return None
    models = _parameter_owners(call)
    return models[0] if models else None


def _restores(stmt: ast.stmt, model: str) -> bool:
    """``ema.restore(model.parameters())`` in the statement."""
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "restore"
        and model in _parameter_owners(sub)
        for sub in ast.walk(stmt)
    )


def _parameter_owners(call: ast.Call) -> list[str]:
    """``["unet"]`` for ``restore(unet.parameters())``: whose parameters the call is given."""
    owners = []
    for arg in call.args:
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute):
            owner = dotted(arg.func.value)
            if arg.func.attr == "parameters" and owner is not None:
                owners.append(owner)
    return owners
