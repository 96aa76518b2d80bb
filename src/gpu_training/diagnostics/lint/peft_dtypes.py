"""What PEFT adapters and per-parameter casts do to the dtype of the parameters Adam steps
(``GT019``, :func:`~gpu_training.diagnostics.lint.bf16_models.scope_dtypes`).

peft's ``get_peft_model(model, config)`` and ``PeftModel.from_pretrained(model, ...)`` create
their adapters in float32 over a bf16 base (``autocast_adapter_dtype``, peft 0.21 measured) and
freeze the base: Adam then steps fp32 parameters however the base was converted.
``inject_adapter_in_model`` (diffusers' ``add_adapter``) makes them in the base layer's dtype
instead, bf16 over a bf16 base. A loop that casts the parameters themselves
(``for p in model.parameters(): p.data = p.data.to(torch.bfloat16)``) converts the model.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> source = "model = load()\\nmodel = get_peft_model(model, config)\\n"
    >>> facts = ModuleFacts(ast.parse(source))
    >>> call = facts.calls[-1]
    >>> sorted(peft_wrapped(call, facts, facts.tree, lambda call, facts: "model"))
    ['model']
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from gpu_training.diagnostics.lint.calls import parents
from gpu_training.diagnostics.lint.model import ModuleFacts, dotted

__all__ = ["parameters_owner", "peft_wrapped"]

_BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)
_PARAMETER_LISTS = frozenset({"parameters", "named_parameters"})


def peft_wrapped(
    call: ast.Call,
    facts: ModuleFacts,
    scope_node: ast.AST,
    bound: Callable[[ast.Call, ModuleFacts], str | None],
) -> set[str]:
    """The names whose trainable parameters ``call`` makes fp32 PEFT adapters: the model handed
    to ``get_peft_model``/``PeftModel.from_pretrained`` (changed in place) and the name the
    result is bound to (``bound(call, facts)``). Only a wrapping every run of the scope takes: one under an ``if`` (a
    ``--train_type lora`` branch beside a full fine-tune) leaves the other path's bf16 weights.
    """
    name = facts.imports.resolve(dotted(call.func)) or ""
    if name.rsplit(".", 1)[-1] != "get_peft_model" and not name.endswith(
        "PeftModel.from_pretrained"
    ):
        return set()
    up = parents(facts)
    node: ast.AST | None = up.get(id(call))
    while node is not None and node is not scope_node:
        if isinstance(node, _BRANCHES):
            return set()
        node = up.get(id(node))
    names = {bound(call, facts), dotted(call.args[0]) if call.args else None}
    return {n for n in names if n is not None}


def parameters_owner(target: ast.AST, facts: ModuleFacts) -> str | None:
    """The model whose parameters a cast of ``p.data`` converts: ``p`` the variable of an
    enclosing ``for p in model.parameters():`` (or ``for _, p in model.named_parameters():``)."""
    if not (
        isinstance(target, ast.Attribute)
        and target.attr == "data"
        and isinstance(target.value, ast.Name)
    ):
        return None
    variable = target.value.id
    up = parents(facts)
    node = up.get(id(target))
    while node is not None:
        if isinstance(node, (ast.For, ast.AsyncFor)):
            names = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
            last = names[-1] if names else None
            iterated = node.iter
            if (
                isinstance(last, ast.Name)
                and last.id == variable
                and isinstance(iterated, ast.Call)
                and isinstance(iterated.func, ast.Attribute)
                and iterated.func.attr in _PARAMETER_LISTS
            ):
                return dotted(iterated.func.value)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return None
        node = up.get(id(node))
    return None
