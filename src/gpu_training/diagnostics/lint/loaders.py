"""Where a ``DataLoader``'s batches go: into a training step, or only into evaluation.

``GT003`` (no distributed sampler) matters for a loader a training step reads: every rank
then trains on the same data. A loader whose every use is a loop that never trains — a
tensor-parallel evaluation where every rank must see the same batches — is not one. The
batches are followed from the name the loader is bound to: a ``for`` over it (through
``enumerate``, ``tqdm``…) trains when its body runs a backward, ``zero_grad`` or an
optimizer's ``step``, itself or through a function of the project; a call that hands it to a
function of the project is followed into that function's parameter. In a file that trains
somewhere, a loop with no visible step counts as evaluation only under ``torch.no_grad()``
(or ``inference_mode()``): it may step through a library call. Anything else (returned,
stored on an object, handed to a library, never used) may reach training: the loader counts
as a training loader, so the rule keeps reporting what it cannot follow.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("def f(ds):\\n    dl = DataLoader(ds)\\n"
    ...                  "    for b in tqdm(dl):\\n        model(b)\\nf(data)\\n")
    >>> facts = ModuleFacts(tree)
    >>> func = tree.body[0]
    >>> loader, scope = func.body[0].value, facts.scope_of(func)
    >>> feeds_training(facts, loader, scope, "dl", file_trains=False)
    False
    >>> feeds_training(facts, loader, scope, "dl")  # `model(b)` may hide a step
    True
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import node_start, tail
from gpu_training.diagnostics.lint.micro_batches import named_anywhere
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted, iter_scope_nodes
from gpu_training.diagnostics.lint.never_called import in_unnamed_class

__all__ = ["feeds_training", "own_loader_class", "project_classes", "trains_on_argument"]

_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip", "islice", "list"})
_READERS = frozenset({"len", "print", "repr", "str", "isinstance", "type", "id"})
"""Builtins that look at a loader without drawing a batch from it."""
_MAX_DEPTH = 3  # functions followed from the loader's own scope
_Use = tuple[str, ast.AST]  # ("loop", the loop) / ("call", the call) / ("other", the name)


def feeds_training(
    facts: ModuleFacts,
    loader: ast.Call,
    scope: Scope,
    name: str | None,
    *,
    file_trains: bool = True,
    depth: int = 0,
) -> bool:
    """Whether a loader's batches may reach a training step.

    Args:
        facts: The module's facts (with its project, if any).
        loader: The ``DataLoader(...)`` call.
        scope: The scope it is in.
        name: The local name it is bound to (None: not bound to a plain name).
        file_trains: The file runs a training step somewhere (itself or through the
            project): then a loop counts as evaluation only under ``torch.no_grad()`` or
            ``inference_mode()``, since it may train through a call nobody here can read.
        depth: How many functions deep the loader has been followed.

    Returns:
        False when every use of the loader is a loop that does not train (or a call of a
        function of the project whose parameter is used so), or when the function building
        it is named nowhere in the project (it never runs); True otherwise.
    """
    if depth == 0 and not named_anywhere(facts, scope.node):
        return False  # built in a module-level function nothing names: it never runs
    if depth == 0 and in_unnamed_class(facts, scope.node):
        return False  # a method of a class no one makes an object of
    if name is None or "." in name or depth > _MAX_DEPTH:
        return True
    uses = _uses(facts, scope).get(name, [])
    if not uses:
        return True  # built and never read here: returned or kept, where it goes is not shown
    return any(_use_trains(facts, use, loader, scope, name, depth, file_trains) for use in uses)


def own_loader_class(facts: ModuleFacts, call: ast.Call) -> bool:
    """``DataLoader(...)`` naming a class of the project that is not torch's (``class
    DataLoader:`` with its own batching, no ``torch.utils.data.DataLoader`` base): it takes
    no sampler, and whatever it hands each rank is its own code's business."""
    classes = project_classes(facts, call)
    return bool(classes) and not any(
        tail(dotted(base)).endswith("DataLoader") for cls in classes for base in cls.bases
    )


def project_classes(facts: ModuleFacts, call: ast.Call) -> list[ast.ClassDef]:
    """The classes of the project a call constructs: of this file by name, or (imported) the
    class whose ``__init__`` it runs."""
    classes: list[ast.ClassDef] = []
    name = dotted(call.func)
    local = facts.toplevel.get(name or "")
    if isinstance(local, ast.ClassDef) and name not in facts.imports.names:
        classes.append(local)
    for owner, func in facts.callees(call):
        cls = owner.class_of(func)
        if cls is not None:
            classes.append(cls)
    return classes


def trains_on_argument(
    owner: ModuleFacts, func: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call
) -> bool:
    """Whether a call hands ``func`` something it loops over in a training step: ``def
    train_epoch(self, model, loader, opt): for batch in loader: ... loss.backward()``, called
    as ``self.train_epoch(self.model, self.train_loader, self.optimizer)``.

    Args:
        owner: The facts of the module defining ``func``.
        func: A function of the project the call may run.
        call: The call.
    """
    params = _params(func, call)
    bound = [params[i] for i, a in enumerate(call.args) if i < len(params)]
    bound += [k.arg for k in call.keywords if k.arg is not None]
    bound += _wrapped(owner, func, bound)
    uses = _uses(owner, owner.scope_of(func))
    return any(
        what == "loop" and _trains(owner, node)
        for name in bound
        for what, node in uses.get(name, [])
    )


def _wrapped(owner: ModuleFacts, func: ast.AST, names: list[str]) -> list[str]:
    """Names bound to a call given one of ``names`` first: ``bar = dist_tqdm(loader)`` (a
    progress bar, a prefetcher) yields the loader's batches when it is looped over."""
    return [
        node.targets[0].id
        for node in owner.scope_nodes.get(func, [])
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Call)
        and node.value.args
        and isinstance(node.value.args[0], ast.Name)
        and node.value.args[0].id in names
    ]


def _use_trains(
    facts: ModuleFacts,
    use: _Use,
    loader: ast.Call,
    scope: Scope,
    name: str,
    depth: int,
    file_trains: bool,
) -> bool:
    what, node = use
    if what == "loop":
        return _trains(facts, node) or (file_trains and not _without_grad(facts, node, scope))
    if what != "call" or not isinstance(node, ast.Call) or node is loader:
        return True
    called = dotted(node.func)
    if called in _READERS and called not in facts.imports.names:
        return False  # `len(loader)`, `print(loader)`: reads it, draws no batch
    refs = facts.callees(node)
    if not refs:
        return True  # a library call (a framework's trainer): it may train on it
    for owner, func in refs:
        param = _parameter(func, node, name)
        if param is None:
            return True
        inner = owner.scope_of(func)
        if feeds_training(owner, loader, inner, param, file_trains=file_trains, depth=depth + 1):
            return True
    return False


def _parameter(
    func: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, name: str
) -> str | None:
    """The parameter of ``func`` a call binds the name ``name`` to (None: not a plain one)."""
    params = _params(func, call)
    for keyword in call.keywords:
        if isinstance(keyword.value, ast.Name) and keyword.value.id == name:
            return keyword.arg  # None for **kwargs: not followed
    for index, arg in enumerate(call.args):
        if isinstance(arg, ast.Name) and arg.id == name:
            return params[index] if index < len(params) else None
    return None


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call) -> list[str]:
    """The positional parameters a call fills, ``self`` left out for a bound method or a
    class's ``__init__`` (``Trainer(model, loader)``)."""
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    bound = isinstance(call.func, ast.Attribute) or func.name == "__init__"
    return params[1:] if params and params[0] in ("self", "cls") and bound else params


def _without_grad(facts: ModuleFacts, loop: ast.AST, scope: Scope) -> bool:
    """The loop runs under ``torch.no_grad()``/``inference_mode()`` (a ``with`` around it or
    in its body, or a decorator of its function): it evaluates."""
    func = scope.node
    if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        _no_grad(d) for d in func.decorator_list
    ):
        return True
    return any(
        isinstance(node, (ast.With, ast.AsyncWith))
        and any(_no_grad(item.context_expr) for item in node.items)
        and (_within(node, loop) or _within(loop, node))
        for node in facts.scope_nodes.get(scope.node, [])
    )


def _within(outer: ast.AST, inner: ast.AST) -> bool:
    end = (getattr(outer, "end_lineno", 0) or 0, getattr(outer, "end_col_offset", 0) or 0)
    return node_start(outer) <= node_start(inner) <= end


def _no_grad(expr: ast.expr) -> bool:
    target = expr.func if isinstance(expr, ast.Call) else expr
    return tail(dotted(target)) in ("no_grad", "inference_mode")


def _uses(facts: ModuleFacts, scope: Scope) -> dict[str, list[_Use]]:
    """Every read of every plain name of a scope, by what reads it (built once per scope)."""
    key = ("name-uses", id(scope.node))
    cached = facts.memo.get(key)
    if isinstance(cached, dict):
        return cached
    uses: dict[str, list[_Use]] = {}
    placed: set[int] = set()
    nodes = facts.scope_nodes.get(scope.node, [])
    for node in nodes:  # loops first: a name under `tqdm(...)` in a loop's iterable is the loop's
        source = _loop_source(node)
        if source is not None:
            placed.add(id(source))
            uses.setdefault(source.id, []).append(("loop", node))
    for node in nodes:
        if isinstance(node, ast.Call):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(arg, ast.Name) and id(arg) not in placed:
                    placed.add(id(arg))
                    uses.setdefault(arg.id, []).append(("call", node))
    for node in nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in placed:
            uses.setdefault(node.id, []).append(("other", node))
    for inner in facts.scopes.values():  # a closure reading the name: where it goes is not shown
        if inner.parent is scope:
            for node in facts.scope_nodes.get(inner.node, []):
                if isinstance(node, ast.Name) and node.id not in inner.bindings:
                    uses.setdefault(node.id, []).append(("other", node))
    facts.memo[key] = uses
    return uses


def _loop_source(node: ast.AST) -> ast.Name | None:
    """The plain name a ``for`` (or a comprehension) iterates, through ``tqdm(...)`` etc."""
    if isinstance(node, (ast.For, ast.AsyncFor)):
        expr = node.iter
    elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        expr = node.generators[0].iter
    else:
        return None
    while isinstance(expr, ast.Call) and expr.args and tail(dotted(expr.func)) in _WRAPPERS:
        expr = expr.args[0]
    return expr if isinstance(expr, ast.Name) else None


def _trains(facts: ModuleFacts, loop: ast.AST) -> bool:
    """The loop runs a training step, itself or through a function of the project."""
    body = loop.body if isinstance(loop, (ast.For, ast.AsyncFor)) else [loop]
    for node in iter_scope_nodes(body):  # type: ignore[arg-type]
        if not isinstance(node, ast.Call):
            continue
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        receiver = tail(dotted(node.func.value)) if isinstance(node.func, ast.Attribute) else ""
        if method in ("backward", "zero_grad") or (method == "step" and "optim" in receiver):
            return True
        if any(s.trains for s in facts.summaries(node)):
            return True
        if facts.resolver is None and facts.local_functions(node):
            return True  # the file alone, no summaries: a function of its own may train
    return False
