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

A method of a module-level class that nothing names (no module reads the class's name,
imports it, derives from it or spells it in a string, and no config file of the repository
names it, as a Hydra ``_target_`` would) never runs either, whatever its method is called:
no object of the class is ever made (:func:`in_unnamed_class`, a data module left beside
the ones the scripts use).
"""

from __future__ import annotations

import ast
import os

from gpu_training.diagnostics.lint.micro_batches import named_anywhere
from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.repo_files import repository_of, text_files

__all__ = ["in_unnamed_class", "never_runs"]

_CONFIGS = (".yaml", ".yml", ".json", ".toml", ".cfg", ".sh")


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


def in_unnamed_class(facts: ModuleFacts, func: ast.AST) -> bool:
    """Whether ``func`` is a method of a module-level class (no decorator) whose name nothing
    in the linted project nor in the repository's config files mentions: no object of it is
    made, so the method never runs.

    Args:
        facts: The function's module.
        func: A ``def``.

    Returns:
        True for a method of such a class; False otherwise (and for a file not on disk).
    """
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    owner = facts.scope_of(func).cls if func in facts.scopes else None
    if owner is None or owner not in facts.tree.body or owner.decorator_list:
        return False
    if facts.path in ("", "<string>") or facts.resolver is None:
        return False
    modules = list(getattr(facts.resolver, "linted", {}).values()) or [facts]
    if any(owner.name in _attribute_names(m) for m in modules):
        return False
    if any(
        isinstance(node, ast.Constant) and isinstance(node.value, str) and owner.name in node.value
        for m in modules
        for node in m.nodes
    ):
        return False  # `registry["CocoDataModule"]`, `"data.CocoDataModule"`
    root = repository_of(os.path.abspath(facts.path))
    return not any(owner.name in text for _, text in text_files(root, _CONFIGS))
