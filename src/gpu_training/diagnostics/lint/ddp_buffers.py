"""A DDP model's forward is a collective when the wrapped module has buffers.

``DistributedDataParallel(module)`` keeps ``broadcast_buffers=True`` by default: the first
forward after a forward with gradients (a training step) broadcasts every buffer of the module
(BatchNorm's running statistics, a registered ``pixel_mean``) from rank 0. Evaluation on rank 0
only with the wrapped model (``if rank == 0: model(x)``) then enters a broadcast the other
ranks never join: rank 0 hangs, or the broadcast is matched with the other ranks' next
collective and the job fails there (reproduced on 2 gloo ranks: a BatchNorm model hangs in
rank 0's first evaluation forward, the same model without BatchNorm does not). A module
without buffers, ``broadcast_buffers=False`` or the unwrapped ``model.module`` issue nothing.

The buffers must be evident in the code: a ``BatchNorm``/``SyncBatchNorm`` layer or an
unconditional ``register_buffer`` in the project's model class (its base classes and the
classes it builds, across files when the project is known), or a torchvision model of a
family built with BatchNorm. A library model whose buffers the code does not show
(``AutoModel.from_pretrained``) is not judged.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = "import torch.nn as nn\\nfrom torch.nn.parallel import DistributedDataParallel as DDP\\n"
    >>> src += "net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))\\nmodel = DDP(net)\\n"
    >>> tree = ast.parse(src + "model(x)\\n")
    >>> facts = ModuleFacts(tree)
    >>> ddp_forward_buffers(tree.body[-1].value, facts.module_scope, facts)
    'BatchNorm1d (<string>:3)'
"""

from __future__ import annotations

import ast
import os
import re

from gpu_training.diagnostics.lint.calls import (
    call_arg,
    enclosing_blocks,
    keyword_arg,
    parameter_index,
    tail,
)
from gpu_training.diagnostics.lint.kind_calls import PASSTHROUGH_METHODS
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.summary import FuncRef

__all__ = ["ddp_forward_buffers", "wraps_ddp"]

_DDP = frozenset({"DistributedDataParallel", "DDP"})
_NORM_WITH_STATS = re.compile(r"^(Lazy)?(Sync)?BatchNorm([123]d)?$")
_TORCHVISION_BN = re.compile(
    r"^(resnet|resnext|wide_resnet|densenet|mobilenet|efficientnet|regnet|inception|googlenet"
    r"|mnasnet|shufflenet|vgg\d+_bn)"
)
_CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})
_MAX_DEPTH = 12


def wraps_ddp(facts: ModuleFacts) -> bool:
    """Whether the file calls ``DistributedDataParallel`` / ``DDP`` at all (memoised): only
    then is a forward worth asking :func:`ddp_forward_buffers` about."""
    cached = facts.memo.get("wraps-ddp")
    if isinstance(cached, bool):
        return cached
    found = any(tail(call_name(c, facts.imports)) in _DDP for c in facts.calls)
    facts.memo["wraps-ddp"] = found
    return found


def ddp_forward_buffers(call: ast.Call, scope: Scope, facts: ModuleFacts) -> str | None:
    """The evidence that ``call`` runs the forward of a DDP model whose module has buffers
    (``"BatchNorm2d in ResNet (models.py:12)"``), or None: the forward itself
    (``model(x)``, ``self.model(x)``, ``model.forward(x)``), or a project function the DDP
    model is handed to that calls it (``validate(model, loader)``).

    Args:
        call: The call.
        scope: Where the call is.
        facts: The file's facts.
    """
    if not wraps_ddp(facts):
        return None
    func = call.func
    target: ast.expr | None = (
        func.value if isinstance(func, ast.Attribute) and func.attr == "forward" else func
    )
    found = None
    if isinstance(target, (ast.Name, ast.Attribute)):
        found = _ddp_evidence(target, scope, facts)
    if found is None:
        found, target = _handed_to_forward(call, scope, facts)
    if found is None or _paired_by_training(call, target, facts):
        return None
    return found


def _paired_by_training(call: ast.Call, model: ast.expr | None, facts: ModuleFacts) -> bool:
    """Whether the loop around ``call`` runs the same model's forward after it, in the same
    iteration (``if epoch % 10 == 0: evaluate(model)`` then the epoch's training): the other
    ranks' next training forward broadcasts the buffers too, so rank 0's broadcast is matched
    on every iteration, the last included. Evaluation after the epoch's training has nothing
    after it in the last iteration, and the job hangs there."""
    name = dotted(model) if model is not None else None
    if name is None:
        return False
    root = facts.scope_containing(call).node
    path = enclosing_blocks(getattr(root, "body", []), call)
    for depth in range(len(path) - 1, -1, -1):
        body, index = path[depth]
        owner = path[depth - 1][0][path[depth - 1][1]] if depth else None
        if not isinstance(owner, (ast.For, ast.AsyncFor, ast.While)):
            continue
        for later in body[index + 1 :]:  # an evaluation loop inside: the loop around it
            for node in ast.walk(later):
                if isinstance(node, ast.Call) and node is not call:
                    callee = node.func
                    if isinstance(callee, ast.Attribute) and callee.attr == "forward":
                        callee = callee.value
                    if dotted(callee) == name:
                        return True
    return False


def _ddp_evidence(target: ast.expr, scope: Scope, facts: ModuleFacts) -> str | None:
    """Evidence that ``target`` is a DDP model that broadcasts buffers, or None."""
    if "ddp" not in facts.kinds(target, scope):
        return None
    for wrap, where in _ddp_calls(target, scope, facts, 0, set()):
        off = keyword_arg(wrap, "broadcast_buffers")
        if isinstance(off, ast.Constant) and not off.value:
            continue
        inner = wrap.args[0] if wrap.args else keyword_arg(wrap, "module")
        if inner is None:
            continue
        found = _buffers(inner, where, facts, 0, set())
        if found is not None:
            return found
    return None


def _handed_to_forward(
    call: ast.Call, scope: Scope, facts: ModuleFacts
) -> tuple[str | None, ast.expr | None]:
    """``validate(opt, loader, model)`` with ``model`` a DDP model with buffers, and
    ``validate`` a project function that calls that parameter (its forward)."""
    handed = [
        (i, None, arg)
        for i, arg in enumerate(call.args)
        if isinstance(arg, (ast.Name, ast.Attribute))
    ] + [
        (-1, k.arg, k.value)
        for k in call.keywords
        if isinstance(k.value, (ast.Name, ast.Attribute))
    ]
    wrapped = _ddp_names(facts)
    handed = [h for h in handed if dotted(h[2]) in wrapped and "ddp" in facts.kinds(h[2], scope)]
    if not handed:
        return None, None
    for owner, func in facts.callees(call):
        if func.name == "__init__":
            continue
        params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
        if isinstance(call.func, ast.Attribute) and params[:1] in (["self"], ["cls"]):
            params = params[1:]
        for index, keyword, arg in handed:
            name = (
                keyword if keyword is not None else params[index] if index < len(params) else None
            )
            forward = _forward_of(func, name) if name is not None else None
            if forward is None:
                continue
            found = _ddp_evidence(arg, scope, facts)
            if found is not None:
                at = f"{os.path.basename(owner.path) or 'line'}:{forward.lineno}"
                return f"{func.name}() runs its forward at {at}; {found}", arg
    return None, None


def _ddp_names(facts: ModuleFacts) -> frozenset[str]:
    """The names the file binds to a ``DDP(...)`` call (``model = DDP(model).to(device)``),
    memoised: only these are worth following into the functions they are handed to."""
    cached = facts.memo.get("ddp-names")
    if isinstance(cached, frozenset):
        return cached
    names: set[str] = set()
    bindings = [s.bindings for s in facts.scopes.values()]
    for per_class in facts.class_bindings.values():
        bindings.append({k: [((0, 0), v) for v in vs] for k, vs in per_class.items()})
    for table in bindings:
        for key, entries in table.items():
            for _, value in entries:
                while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                    if value.func.attr not in PASSTHROUGH_METHODS:
                        break
                    value = value.func.value
                if isinstance(value, ast.Call) and tail(call_name(value, facts.imports)) in _DDP:
                    names.add(key)
    found = frozenset(names)
    facts.memo["ddp-names"] = found
    return found


def _forward_of(func: ast.FunctionDef | ast.AsyncFunctionDef, param: str) -> ast.Call | None:
    """The first call of parameter ``param`` (``param(x)``, ``param.forward(x)``) in ``func``,
    outside nested functions and classes."""
    stack: list[ast.AST] = list(func.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            callee = node.func
            if isinstance(callee, ast.Attribute) and callee.attr == "forward":
                callee = callee.value
            if isinstance(callee, ast.Name) and callee.id == param:
                return node
        stack.extend(ast.iter_child_nodes(node))
    return None


def _ddp_calls(
    expr: ast.expr, scope: Scope, facts: ModuleFacts, depth: int, seen: set[int]
) -> list[tuple[ast.Call, Scope]]:
    """The ``DDP(...)`` calls ``expr`` is bound to, each with the scope it is made in."""
    if depth > _MAX_DEPTH or id(expr) in seen:
        return []
    seen.add(id(expr))
    if isinstance(expr, ast.Call):
        name = call_name(expr, facts.imports)
        if tail(name) in _DDP:
            return [(expr, facts.scope_containing(expr))]
        if isinstance(expr.func, ast.Attribute) and expr.func.attr in PASSTHROUGH_METHODS:
            return _ddp_calls(expr.func.value, scope, facts, depth + 1, seen)
        if name == "torch.compile" and expr.args:
            return _ddp_calls(expr.args[0], scope, facts, depth + 1, seen)
        return []
    key = dotted(expr)
    if key is None:
        return []
    found: list[tuple[ast.Call, Scope]] = []
    for value in facts.lookup(key, scope, (expr.lineno, expr.col_offset)):
        if value is not None and value is not expr:
            found += _ddp_calls(value, facts.scope_containing(value), facts, depth + 1, seen)
    return found


def _buffers(
    expr: ast.expr, scope: Scope, facts: ModuleFacts, depth: int, seen: set[int]
) -> str | None:
    """Evidence that the module ``expr`` evaluates to has buffers, or None (none or unknown)."""
    if depth > _MAX_DEPTH or id(expr) in seen:
        return None
    seen.add(id(expr))
    if isinstance(expr, ast.Call):
        return _made_buffers(expr, facts, depth, seen)
    if isinstance(expr, ast.IfExp):  # `convert_sync_batchnorm(m) if cfg.sync_bn else m`
        for branch in (expr.body, expr.orelse):
            found = _buffers(branch, scope, facts, depth + 1, seen)
            if found is not None:
                return found
        return None
    key = dotted(expr)
    if key is None:
        return None
    for value in facts.lookup(key, scope, (expr.lineno, expr.col_offset)):
        if value is not None and value is not expr:
            found = _buffers(value, facts.scope_containing(value), facts, depth + 1, seen)
            if found is not None:
                return found
    return _passed_buffers(key, scope, facts, depth + 1, seen)


def _passed_buffers(
    key: str, scope: Scope, facts: ModuleFacts, depth: int, seen: set[int]
) -> str | None:
    """A parameter of the function ``scope`` opens (``def do_train(cfg, model, ...)`` then
    ``DDP(model)``): the buffers of what its callers pass, in this file and, when the project
    is known, in the other linted files."""
    func = scope.node
    if depth > _MAX_DEPTH or not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    if key not in params and key not in (a.arg for a in func.args.kwonlyargs):
        return None
    sites = [(facts, call, where) for call, where in facts.calls_of(func)]
    if facts.resolver is not None:
        sites += facts.resolver.incoming((facts, func))
    index = parameter_index(func, key)
    for owner, call, where in sites:
        arg = call_arg(call, index, key)
        if arg is not None:
            found = _buffers(arg, where, owner, depth + 1, seen)
            if found is not None:
                return found
    return None


def _made_buffers(call: ast.Call, facts: ModuleFacts, depth: int, seen: set[int]) -> str | None:
    """Buffers of what ``call`` builds: a norm layer, a torchvision model, a class or a
    builder function of the project."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in PASSTHROUGH_METHODS:
        return _buffers(func.value, facts.scope_containing(func), facts, depth + 1, seen)
    name = call_name(call, facts.imports)
    last = tail(name)
    if last == "convert_sync_batchnorm" and call.args:  # SyncBatchNorm keeps the buffers
        return _buffers(call.args[0], facts.scope_containing(call), facts, depth + 1, seen)
    if last in _DDP:  # `model = DDP(model)` in one branch, read by the other branch's DDP
        inner = call.args[0] if call.args else keyword_arg(call, "module")
        return (
            None
            if inner is None
            else _buffers(inner, facts.scope_containing(call), facts, depth + 1, seen)
        )
    at = f"{os.path.basename(facts.path) or 'line'}:{call.lineno}"
    if _NORM_WITH_STATS.match(last):
        return f"{last} ({at})"
    if name.startswith("torchvision.models") and _TORCHVISION_BN.match(last):
        return f"torchvision {last}, built with BatchNorm ({at})"
    if last in _CONTAINERS:  # `nn.Sequential(nn.Conv2d(...), nn.BatchNorm2d(...))`
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            for node in ast.walk(arg):
                if isinstance(node, ast.Call) and node is not call:
                    found = _made_buffers(node, facts, depth + 1, seen)
                    if found is not None:
                        return found
        return None
    if isinstance(func, ast.Subscript):  # `MODELS[name](...)`: any model of the table
        return _table_buffers(func.value, facts, depth + 1, seen)
    if isinstance(func, ast.Name) and func.id not in facts.imports.names:
        local = facts.toplevel.get(func.id)
        if isinstance(local, ast.ClassDef):
            return _class_buffers(facts, local, depth + 1)
    for owner, made in _callees(call, facts):
        cls = owner.class_of(made) if made.name == "__init__" else None
        if cls is not None:
            found = _class_buffers(owner, cls, depth + 1)
        else:
            found = _returned_buffers(owner, made, depth + 1, seen)
        if found is not None:
            return found
    return None


def _callees(call: ast.Call, facts: ModuleFacts) -> list[FuncRef]:
    """The project functions (or class ``__init__``) a call runs, a star import's included."""
    found = facts.callees(call)
    if not found and isinstance(call.func, ast.Name) and facts.resolver is not None:
        found = facts.resolver.star_callees(facts, call.func.id)
    return found


def _table_buffers(table: ast.expr, facts: ModuleFacts, depth: int, seen: set[int]) -> str | None:
    """A dict of model constructors (``{"resnet50": models.resnet50, ...}``, here or imported
    from the project): the buffers of the first entry that shows any (the key is chosen at
    run time)."""
    key = dotted(table)
    if key is None or depth > _MAX_DEPTH:
        return None
    owner: ModuleFacts | None = facts
    values = facts.lookup_all(key, facts.scope_containing(table))
    if not values and key in facts.imports.origins:
        owner, values = _imported_values(facts, key, 0)
    for value in values:
        if owner is None or not isinstance(value, ast.Dict):
            continue
        for entry in value.values:
            if isinstance(entry, (ast.Name, ast.Attribute)):
                made = ast.copy_location(ast.Call(entry, [], []), entry)
                found = _made_buffers(made, owner, depth + 1, seen)
                if found is not None:
                    return found
    return None


def _imported_values(
    facts: ModuleFacts, name: str, depth: int
) -> tuple[ModuleFacts | None, list[ast.expr | None]]:
    """The module-level values an imported name is bound to in the project module it comes
    from (through re-exports), with that module's facts."""
    resolver = facts.resolver
    if resolver is None or depth > 4 or name not in facts.imports.origins:
        return None, []
    module, level, symbol = facts.imports.origins[name]
    target = resolver.module_facts(facts, module, level)
    if target is None or symbol is None:
        return None, []
    values = target.module_scope.bindings.get(symbol)
    if values:
        return target, [value for _, value in values]
    return _imported_values(target, symbol, depth + 1)


def _returned_buffers(
    owner: ModuleFacts, func: ast.FunctionDef | ast.AsyncFunctionDef, depth: int, seen: set[int]
) -> str | None:
    """A builder function's model: the buffers of what it returns."""
    if depth > _MAX_DEPTH:
        return None
    scope = owner.scope_of(func) if func in owner.scopes else owner.module_scope
    for node in ast.walk(func):
        if isinstance(node, ast.Return) and node.value is not None:
            found = _buffers(node.value, scope, owner, depth + 1, seen)
            if found is not None:
                return found
    return None


def _class_buffers(owner: ModuleFacts, cls: ast.ClassDef, depth: int) -> str | None:
    """Buffers of the project class ``cls``: a norm layer with running statistics, an
    unconditional ``register_buffer``, a torchvision BatchNorm model, or the same in a class
    it derives from or builds (memoised per class)."""
    key = ("class-buffers", id(cls))
    if key in owner.memo:
        cached = owner.memo[key]
        return cached if isinstance(cached, str) else None
    owner.memo[key] = False  # a class that builds itself: no answer inside the recursion
    found = _class_buffers_uncached(owner, cls, depth)
    owner.memo[key] = found if found is not None else False
    return found


def _class_buffers_uncached(owner: ModuleFacts, cls: ast.ClassDef, depth: int) -> str | None:
    where = f"{cls.name} ({os.path.basename(owner.path) or 'here'}:{{line}})"
    for base in cls.bases:
        if isinstance(base, ast.Name) and isinstance(owner.toplevel.get(base.id), ast.ClassDef):
            base_cls = owner.toplevel[base.id]
            assert isinstance(base_cls, ast.ClassDef)
            found = _class_buffers(owner, base_cls, depth + 1) if depth < _MAX_DEPTH else None
            if found is not None:
                return found
    for node in ast.walk(cls):  # built, or named as the default norm layer
        if isinstance(node, (ast.Name, ast.Attribute)) and _NORM_WITH_STATS.match(
            tail(dotted(node) or "")
        ):
            return f"{tail(dotted(node) or '')} in " + where.format(line=node.lineno)
    for call in _unconditional_calls(cls):
        name = call_name(call, owner.imports)
        last = tail(name)
        if last == "register_buffer" and dotted(call.func) == "self.register_buffer":
            return "register_buffer in " + where.format(line=call.lineno)
        if name.startswith("torchvision.models") and _TORCHVISION_BN.match(last):
            return f"torchvision {last} in " + where.format(line=call.lineno)
    if depth >= _MAX_DEPTH:
        return None
    for call in _unconditional_calls(cls):  # the classes it builds: `self.backbone = ResNet()`
        if isinstance(call.func, ast.Name):
            built = owner.toplevel.get(call.func.id)
            if isinstance(built, ast.ClassDef) and built is not cls:
                found = _class_buffers(owner, built, depth + 1)
                if found is not None:
                    return found
            elif call.func.id in owner.imports.origins or owner.imports.stars:
                for ref_owner, made in _callees(call, owner):
                    sub = ref_owner.class_of(made) if made.name == "__init__" else None
                    if sub is not None:
                        found = _class_buffers(ref_owner, sub, depth + 1)
                        if found is not None:
                            return found
    return None


def _unconditional_calls(cls: ast.ClassDef) -> list[ast.Call]:
    """The calls in the class's methods that are not under an ``if``/``try`` of their own
    (nanoGPT's ``if not self.flash: self.register_buffer(...)`` depends on the torch version)."""
    found: list[ast.Call] = []

    def visit(statements: list[ast.stmt]) -> None:
        for stmt in statements:
            if isinstance(stmt, (ast.If, ast.Try, ast.ClassDef)):
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(stmt.body)
                continue
            if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
                visit(stmt.body)
            for node in ast.walk(stmt) if not hasattr(stmt, "body") else _header(stmt):
                if isinstance(node, ast.Call):
                    found.append(node)

    visit(cls.body)
    return found


def _header(stmt: ast.stmt) -> list[ast.AST]:
    """The nodes of a compound statement outside its body (a ``for``'s iterable, a
    ``with``'s items)."""
    parts: list[ast.AST] = []
    for field in ("iter", "test", "items"):
        value = getattr(stmt, field, None)
        if isinstance(value, list):
            for item in value:
                parts += list(ast.walk(item))
        elif isinstance(value, ast.AST):
            parts += list(ast.walk(value))
    return parts
