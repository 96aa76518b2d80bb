"""An optimizer handed to the project's own trainer class, which steps it (``GT019``).

``optim = torch.optim.Adam(model.parameters())`` then ``trainer = DistillTrainer(model, optim,
...)`` and ``trainer.step(batch)``: the training step (``loss.backward()``, ``self.optim.step()``)
is in a method of a class of another module, so the file that builds the optimizer has no
``backward`` of its own. The optimizer is still the one that steps the parameters: the file
trains. A call that takes the optimizer and reaches a function (or a class's ``__init__``)
whose class, a base class of its module, or body runs a training step counts; an optimizer only handed to a checkpoint
loader does not.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> facts = ModuleFacts(ast.parse("opt = torch.optim.Adam(p)\\nload(opt)\\n"))
    >>> handed_to_training(facts, facts.calls[0])
    False
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.model import ModuleFacts, dotted

__all__ = ["handed_to_training", "returned_to_training"]


def handed_to_training(facts: ModuleFacts, optimizer: ast.Call) -> bool:
    """Whether the optimizer built by ``optimizer`` is passed to a project function or class
    (of any module) that runs a training step.

    Args:
        facts: The file's facts.
        optimizer: The optimizer's construction (``torch.optim.Adam(...)``).

    Returns:
        True when a call of the file passes the name the optimizer is bound to into code
        whose summary trains (``backward``, ``zero_grad``, ``optim.step()``).
    """
    resolver = facts.resolver
    name = _bound(facts, optimizer)
    if name is None or resolver is None:
        return False
    for call in facts.calls:
        passed = [*call.args, *(k.value for k in call.keywords)]
        if not any(dotted(node) == name for arg in passed for node in ast.walk(arg)):
            continue
        for module, func in facts.callees(call):
            scope = module.scope_of(func)
            methods: list[ast.AST] = [func]
            if scope.cls is not None and func.name == "__init__":
                methods = _methods(module, scope.cls)
            if any(resolver.summary((module, m)).trains for m in methods):  # type: ignore[arg-type]
                return True
    return False


def returned_to_training(facts: ModuleFacts, optimizer: ast.Call) -> bool:
    """Whether the optimizer is what its function returns (``def get_optimizer(model, lr):
    return torch.optim.AdamW(...)``) to a caller, in this module or another, whose function
    runs a training step (``backward``, ``zero_grad``, ``optimizer.step()``): the helper only
    builds it, the caller steps it.

    Args:
        facts: The file's facts.
        optimizer: The optimizer's construction.
    """
    scope = facts.scope_containing(optimizer)
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    name = _bound(facts, optimizer)
    returned = any(
        isinstance(n, ast.Return)
        and n.value is not None
        and any(n2 is optimizer or (name and dotted(n2) == name) for n2 in ast.walk(n.value))
        for n in facts.scope_nodes.get(func, [])
    )
    if not returned:
        return False
    sites = [(facts, where) for _, where in facts.calls_of(func)]
    if facts.resolver is not None:
        sites += [(owner, where) for owner, _, where in facts.resolver.incoming((facts, func))]
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("backward", "zero_grad", "step")
        for owner, where in sites
        for n in owner.scope_nodes.get(where.node, [])
    )


def _methods(module: ModuleFacts, cls: ast.ClassDef, depth: int = 0) -> list[ast.AST]:
    """The methods of a class and of its base classes defined in the same module
    (``class DistillTrainer(Trainer)``: ``Trainer.train_step`` runs on its objects)."""
    found: list[ast.AST] = [
        n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    for base in cls.bases if depth < 4 else []:
        defined = module.toplevel.get(base.id) if isinstance(base, ast.Name) else None
        if isinstance(defined, ast.ClassDef) and defined is not cls:
            found += _methods(module, defined, depth + 1)
    return found


def _bound(facts: ModuleFacts, call: ast.Call) -> str | None:
    """The name (``optim``, ``self.optimizer``) an optimizer construction is assigned to."""
    for node in facts.nodes:
        if isinstance(node, ast.Assign) and node.value is call and len(node.targets) == 1:
            return dotted(node.targets[0])
    return None
