"""Models a library hands back inside a wrapper whose ``state_dict()`` prefixes every key
(``GT006``).

``deepspeed.initialize(model=net, ...)`` returns the ``DeepSpeedEngine`` first: an
``nn.Module`` that holds the model as ``engine.module``, so ``engine.state_dict()`` is the
plain ``nn.Module`` one, every key under ``module.`` (the engine's own
``module_state_dict()`` or ``save_checkpoint`` are the ones that strip it). An
``Accelerator``'s ``prepare(model, optimizer, loader)`` returns the model wrapped for the
launch (``DistributedDataParallel`` on several GPUs, the DeepSpeed engine under its plugin),
which is why Accelerate's own guides save ``accelerator.unwrap_model(model).state_dict()``.
Only the *model* of ``prepare`` is read as a wrapper: a prepared optimizer's or scheduler's
``state_dict()`` is the inner one's. A model is what the script trains as a model: its
``.parameters()``, ``.train()``/``.eval()`` or a forward call on it. A file that configures
Accelerate's FSDP plugin is left out (FSDP's state dict keys are not prefixed). A class that
keeps the result on ``self`` (``self.model, self.opt = self.accelerator.prepare(...)``) is read
over all its methods, unless one of them rebinds the attribute to the unwrapped model.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("engine, opt, _, _ = deepspeed.initialize(model=net, model_parameters=p)\\n"
    ...        "torch.save(engine.state_dict(), 'w.pt')\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> use = facts.tree.body[1].value.args[0].func.value
    >>> library_wrapper(facts, use, facts.module_scope)
    'deepspeed.initialize() returns the DeepSpeed engine'
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import node_start, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted

__all__ = ["library_wrapper"]

_MODEL_USES = frozenset({"parameters", "named_parameters", "train", "eval"})
_NOT_MODELS = frozenset({"optimizer", "scheduler", "loader", "dist_sampler", "local_sampler"})


def library_wrapper(facts: ModuleFacts, expr: ast.expr, scope: Scope) -> str | None:
    """Why ``expr`` (a name) holds a library's wrapper of the model, or None.

    Args:
        facts: The file's facts.
        expr: The object whose ``state_dict()`` is saved (or which is handed to a helper
            that saves it).
        scope: Where it appears.

    Returns:
        The evidence (``"deepspeed.initialize() returns the DeepSpeed engine"``), or None.
    """
    key = dotted(expr) or ""
    if isinstance(expr, ast.Name):
        binding = _last_binding(facts, expr, scope)
    elif key.startswith("self.") and scope.cls is not None:
        binding = _class_binding(key, scope.cls)
    else:
        return None
    if binding is None:
        return None
    value, index = binding
    name = call_name(value, facts.imports)
    if tail(name) == "initialize" and name.split(".")[0] == "deepspeed":
        return "deepspeed.initialize() returns the DeepSpeed engine" if index == 0 else None
    func = value.func
    if not (isinstance(func, ast.Attribute) and func.attr in ("prepare", "prepare_model")):
        return None
    if not _is_accelerator(facts, func.value) or _configures_fsdp(facts):
        return None
    if index >= len(value.args) or isinstance(value.args[index], ast.Starred):
        return None
    given = value.args[index]
    if facts.kinds(given, scope) & _NOT_MODELS:
        return None
    if not (_used_as_model(facts, key) or _used_as_model(facts, dotted(given))):
        return None
    return f"{ast.unparse(func)}() wraps the model (DDP on several GPUs)"


def _last_binding(facts: ModuleFacts, expr: ast.Name, scope: Scope) -> tuple[ast.Call, int] | None:
    """The call the name was last bound from before ``expr``, and the name's position in
    the unpacked result (0 for a plain ``x = f(...)``)."""
    pos = node_start(expr)
    best: tuple[tuple[int, int], ast.Call, int] | None = None
    current: Scope | None = scope
    while current is not None and expr.id not in current.bindings:
        current = current.parent  # the scope that binds the name (a parameter shadows)
    if current is not None:
        first = current is scope
        for node in facts.scope_nodes.get(current.node, []):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            at = (node.lineno, node.col_offset)
            if first and at > pos:
                continue
            for target in node.targets:
                index = _position(target, expr.id)
                if index is not None and (best is None or at > best[0]):
                    best = (at, node.value, index)
    if best is None:
        return None
    seen = facts.lookup(expr.id, scope, pos)  # a later plain rebinding (unwrap) wins
    if any(v is not None and v is not best[1] for v in seen):
        return None
    return best[1], best[2]


def _class_binding(key: str, cls: ast.ClassDef) -> tuple[ast.Call, int] | None:
    """``self.model, self.opt = self.accelerator.prepare(self.model, self.opt)`` in any
    method of the class: the library call and the attribute's position; None when a method
    also rebinds the attribute to an unwrapped model (``self.model = self.model.module``)."""
    found: tuple[ast.Call, int] | None = None
    for node in ast.walk(cls):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            index = _position(target, key)
            if index is None:
                continue
            value = node.value
            if _unwraps(value):
                return None
            if isinstance(value, ast.Call) and _from_library(value):
                found = (value, index)
    return found


def _from_library(call: ast.Call) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr in (
        "initialize",
        "prepare",
        "prepare_model",
    )


def _unwraps(value: ast.expr) -> bool:
    if isinstance(value, ast.Attribute):
        return value.attr == "module"
    return isinstance(value, ast.Call) and tail(dotted(value.func) or "") == "unwrap_model"


def _position(target: ast.expr, key: str) -> int | None:
    if isinstance(target, (ast.Tuple, ast.List)):
        for i, elt in enumerate(target.elts):
            if dotted(elt) == key:
                return i
        return None
    return 0 if dotted(target) == key else None


def _is_accelerator(facts: ModuleFacts, receiver: ast.expr) -> bool:
    if "accelerator" in facts.kinds(receiver, facts.scope_containing(receiver)):
        return True
    return any(
        tail(call_name(v, facts.imports)) == "Accelerator" for v in facts.instance_values(receiver)
    )


def _configures_fsdp(facts: ModuleFacts) -> bool:
    return any(
        isinstance(node, ast.Call) and "FullyShardedDataParallelPlugin" in (dotted(node.func) or "")
        for node in facts.nodes
    )


def _used_as_model(facts: ModuleFacts, key: str | None) -> bool:
    """Somewhere in the file ``key`` is trained as a model: ``key.parameters()``,
    ``key.train()``, ``key(batch)``."""
    if key is None:
        return False
    for node in facts.nodes:
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if dotted(func) == key:
            return True
        if (
            isinstance(func, ast.Attribute)
            and func.attr in _MODEL_USES
            and dotted(func.value) == key
        ):
            return True
    return False
