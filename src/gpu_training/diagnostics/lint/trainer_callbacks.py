"""Callback objects handed to a training framework: their hooks run where the framework runs.

``Trainer(model=model, args=args, callbacks=[SavePeftModelCallback()])``: the Hugging Face
``Trainer`` calls each callback's ``on_save``, ``on_log``, ``on_evaluate``… in every process of
the launch (its own callbacks test ``state.is_world_process_zero`` before they write), and
Lightning calls a ``Callback``'s hooks on every rank too. Nothing in the project calls those
methods, so without this they would run nowhere: an ``on_save`` that writes the adapter with
``kwargs["model"].save_pretrained(path)`` and no rank test writes it from every process.

The object's construction (or the class handed itself, ``trainer.add_callback(Cls)``) is a site
of each of its ``on_*`` methods, in the context where it is made: under ``if rank == 0:`` on
rank 0 only, in code every rank runs on every rank. A class counts when it derives from
``transformers.TrainerCallback`` or Lightning's ``Callback``, directly or through classes of the
project.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("from transformers import TrainerCallback\\n"
    ...        "class Keep(TrainerCallback):\\n"
    ...        "    def on_save(self, args, state, control, **kw):\\n        pass\\n"
    ...        "cb = Keep()\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> [f.name for _, f in hook_methods(facts, facts.tree.body[2].value)]
    ['on_save']
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.class_bases import project_class
from gpu_training.diagnostics.lint.model import ModuleFacts, dotted
from gpu_training.diagnostics.lint.summary import FuncRef

__all__ = ["hook_methods"]

_HOOK_BASES = frozenset({"TrainerCallback", "Callback"})
_FRAMEWORKS = frozenset({"transformers", "lightning", "pytorch_lightning"})
_MAX_DEPTH = 4


def hook_methods(facts: ModuleFacts, node: ast.AST) -> list[FuncRef]:
    """The hooks (``on_*`` methods) of the framework callback class a node makes or names.

    Args:
        facts: The module's facts (with its project, if any, for an imported class).
        node: A call (``SavePeftModelCallback()``) or a name read (``SavePeftModelCallback``).

    Returns:
        ``(module facts, def)`` of each hook of the class, or nothing: the node names no
        class of the project, or one that is no framework callback.
    """
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return []
    if not isinstance(target, (ast.Name, ast.Attribute)):
        return []
    name = dotted(target)
    memo = facts.memo.setdefault("hook-methods", {})
    assert isinstance(memo, dict)
    if name not in memo:  # asked of every call and name of the file: once per name
        found = project_class(facts, name)
        memo[name] = (
            [
                (found[0], item)
                for item in found[1].body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and item.name.startswith("on_")
            ]
            if found is not None and _derives_from_callback(*found, 0)
            else []
        )
    return list(memo[name])


def _derives_from_callback(owner: ModuleFacts, cls: ast.ClassDef, depth: int) -> bool:
    if depth > _MAX_DEPTH:
        return False
    for base in cls.bases:
        name = dotted(base)
        resolved = owner.imports.resolve(name) or ""
        root, _, _ = resolved.partition(".")
        if resolved.rsplit(".", 1)[-1] in _HOOK_BASES and root in _FRAMEWORKS:
            return True
        parent = project_class(owner, name)
        if (
            parent is not None
            and parent[1] is not cls
            and _derives_from_callback(*parent, depth + 1)
        ):
            return True
    return False
