"""Functions of the project that nothing calls: their calls set no callee's context.

A helper's body starts in the context of its call sites (rank 0 only when every site is).
A call inside a function that never runs is no site: ``def _write_txt(path, data):
manifest.save()``, a legacy wrapper nothing names, would otherwise make ``save`` run on
every rank though every live caller guards it with ``if is_main_process():``.

A function never runs when nothing in the linted project names it:

* a module-level function no module reads, imports or reads off an imported module;
* a method of a plain class (no base class: no framework can call it by its name) whose
  name no module reads as an attribute, a name or a string (``getattr(obj, "name")``).

Methods of classes with a base (``nn.Module.forward``, a Lightning hook, a Trainer
callback), special methods and nested functions are reached in ways not followed here:
they count as running.
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.micro_batches import named_anywhere
from gpu_training.diagnostics.lint.model import ModuleFacts

__all__ = ["never_runs"]


def _attribute_names(module: ModuleFacts) -> frozenset[str]:
    """Every attribute, name and string constant a module reads, built once."""
    cached = module.memo.get("attribute-names")
    if isinstance(cached, frozenset):
        return cached
    names: set[str] = set()
    for node in module.nodes:
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    result = module.memo["attribute-names"] = frozenset(names)
    return result


def never_runs(facts: ModuleFacts, func: ast.AST) -> bool:
    """Whether nothing in the linted project calls or names ``func``.

    Args:
        facts: The function's module.
        func: A ``def`` (anything else runs: the module body).

    Returns:
        True for a module-level function named nowhere, or a method of a class without
        bases whose name no module reads.
    """
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    if func in facts.tree.body:
        return not named_anywhere(facts, func)
    owner = facts.scope_of(func).cls
    if owner is None or owner.bases or owner.keywords or func not in owner.body:
        return False
    if func.name.startswith("__") or func.decorator_list:
        return False
    modules = list(getattr(facts.resolver, "linted", {}).values()) or [facts]
    return not any(func.name in _attribute_names(module) for module in modules)
