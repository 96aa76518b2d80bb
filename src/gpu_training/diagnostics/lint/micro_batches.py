"""A micro-batch loop whose optimizer step is in the caller (``GT013`` one call up).

The backward of each micro-batch and the step after them are often split::

    def forward_backward(batch):            # the micro-batches of one step
        for sub in split(batch, micro):
            loss_of(model(sub)).backward()  # DDP all-reduces here, every micro-batch

    for batch in loader:
        forward_backward(batch)
        optimizer.step()                    # one step after all of them

The loop holds the backward and no step, its function steps nowhere, and every call of the
function in the file is followed, in the block that makes it, by an optimizer step: the loop
accumulates the micro-batches of one step, as when all of it is written in one place.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, iter_scope_nodes

__all__ = ["stepped_by_callers", "steps_handed_optimizer"]

_Steps = Callable[[ast.AST, Scope], bool]


def stepped_by_callers(facts: ModuleFacts, loop: ast.stmt, scope: Scope, steps: _Steps) -> bool:
    """Whether a loop's function steps nowhere and each of its calls is followed by a step.

    Args:
        facts: The module's facts.
        loop: The loop (it runs backward, no step).
        scope: Its scope.
        steps: Whether a node is an optimizer step (in a scope).

    Returns:
        True when the function has callers in the file and each call is followed by a step.
    """
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    if any(steps(n, scope) for n in facts.scope_nodes.get(func, [])):
        return False
    sites = [(c, w) for c, w in facts.calls_of(func) if not _without_sync(c, w)]
    return bool(sites) and all(_step_after(facts, call, where, steps) for call, where in sites)


def _without_sync(call: ast.Call, where: Scope) -> bool:
    """The call runs under ``no_grad()``/``inference_mode()`` (no backward then) or
    ``no_sync()`` (no all-reduce): an evaluation pass, or one that already skips the sync."""
    for node in ast.walk(where.node):
        if isinstance(node, (ast.With, ast.AsyncWith)) and any(n is call for n in ast.walk(node)):
            for item in node.items:
                expr = item.context_expr
                name = expr.func if isinstance(expr, ast.Call) else expr
                last = name.attr if isinstance(name, ast.Attribute) else getattr(name, "id", "")
                if last in ("no_grad", "inference_mode", "no_sync"):
                    return True
    return False


def _step_after(facts: ModuleFacts, call: ast.Call, where: Scope, steps: _Steps) -> bool:
    """A step follows the statement that makes the call (or one enclosing it)."""
    body = getattr(where.node, "body", [])
    chain: list[tuple[ast.stmt, list[ast.stmt]]] = []  # (statement, what follows it)
    block: list[ast.stmt] = body
    while True:
        for index, stmt in enumerate(block):
            if any(n is call for n in ast.walk(stmt)):
                chain.append((stmt, block[index + 1 :]))
                inner = [
                    b
                    for f in ("body", "orelse", "finalbody")
                    for b in [getattr(stmt, f, None)]
                    if isinstance(b, list) and any(n is call for s in b for n in ast.walk(s))
                ]
                block = inner[0] if inner else []
                break
        else:
            break
    return any(
        steps(n, where) for _, following in reversed(chain) for n in iter_scope_nodes(following)
    )


def steps_handed_optimizer(facts: ModuleFacts, call: ast.Call, scope: Scope) -> bool:
    """A call handing an optimizer to a function of the project that calls its ``step()``
    (``mp_trainer.optimize(opt)``), itself or through a function it hands it on to."""
    for index, value in enumerate([*call.args, *(k.value for k in call.keywords)]):
        if "optimizer" not in facts.kinds(value, scope):
            continue
        keyword = call.keywords[index - len(call.args)].arg if index >= len(call.args) else None
        for owner, func in facts.callees(call):
            if _steps_parameter(owner, func, call, index, keyword, 0):
                return True
    return False


def _steps_parameter(
    owner: ModuleFacts,
    func: ast.AST,
    call: ast.Call,
    index: int,
    keyword: str | None,
    depth: int,
) -> bool:
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or depth > 2:
        return False
    names = [a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]]
    param = keyword
    if param is None:
        position = index + (1 if names and names[0] in ("self", "cls") else 0)
        param = names[position] if position < len(names) else None
    if param is None or param not in names:
        return False
    for node in owner.scope_nodes.get(func, []):
        if not isinstance(node, ast.Call):
            continue
        target = node.func
        stepped = (
            target.value if isinstance(target, ast.Attribute) and target.attr == "step" else None
        )
        if isinstance(stepped, ast.Name) and stepped.id == param:
            return True
        for sub_index, arg in enumerate(node.args):
            if isinstance(arg, ast.Name) and arg.id == param:
                for sub_owner, sub in owner.callees(node):
                    if _steps_parameter(sub_owner, sub, node, sub_index, None, depth + 1):
                        return True
    return False


def named_anywhere(facts: ModuleFacts, func: ast.AST) -> bool:
    """Whether a module-level function of a helper module is named anywhere in the linted
    project but its own ``def`` (called, imported, passed as a callback). One named nowhere
    never runs: its loop cannot accumulate on the DDP model the importers make.

    Args:
        facts: The function's module.
        func: The function.

    Returns:
        True when something names it, or when it is not a module-level function (a method,
        a closure: reached in ways not followed here).
    """
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return True
    if func not in facts.tree.body:
        return True
    modules = list(getattr(facts.resolver, "linted", {}).values()) or [facts]
    return any(func.name in _referenced(module) for module in modules)


def _referenced(module: ModuleFacts) -> frozenset[str]:
    """The names a module reads, imports, or reads off an imported module (``utils.train``,
    not ``model.train()``), built once."""
    cached = module.memo.get("referenced-names")
    if isinstance(cached, frozenset):
        return cached
    names: set[str] = set()
    for node in module.nodes:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.update(n for n in (node.name, node.asname) if n)
        elif isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in module.imports.names:
                names.add(node.attr)
    result = module.memo["referenced-names"] = frozenset(names)
    return result
