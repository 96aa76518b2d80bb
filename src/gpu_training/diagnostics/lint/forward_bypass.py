"""``GT020``: a training loss computed on the module a DDP wrapper holds, not on the wrapper.

``DistributedDataParallel`` all-reduces a backward's gradients only when the forward went
through the wrapper: its ``forward`` arms the reducer (``prepare_for_backward``), and the
gradient hooks of a backward it did not arm return at once. A loss computed with
``model.module(x)``, ``model.module.compute_loss(batch)``, ``accelerator.unwrap_model(model)
(x)`` or, where the wrapper was made as ``model = DDP(net)``, with ``net(x)``, backpropagates
on each rank alone: no error, no warning, and every replica steps with its own gradients and
drifts away from the others (measured on 2 gloo ranks: the wrapper's forward gives equal
gradients on both, ``model.module(x)`` gives each rank its own). Lightning Fabric's wrapper
does the same for a method other than ``forward`` called on it (``model.training_step(b)``)
unless ``fabric.mark_forward_method`` names it (``training_step`` and the other
LightningModule step methods it sends through the forward itself).

Found where the loss a backward differentiates is computed, through the assignments of its
function before it, from such a call, and nothing in that function runs the wrapper's own
forward (a side loss on ``model.module`` beside a forward through the wrapper is reduced with
it). The wrapper may be made in the function, in the module, or handed in: a function whose
loss comes from ``param.module...`` is reported where a caller passes it a DDP wrapper.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = '''
    ... from torch.nn.parallel import DistributedDataParallel as DDP
    ... def train(net, batches):
    ...     model = DDP(net)
    ...     for x, y in batches:
    ...         out = model.module(x)
    ...         loss = ((out - y) ** 2).mean()
    ...         loss.backward()
    ... '''
    >>> [(call.lineno, why) for call, why in bypassed_forwards(ModuleFacts(ast.parse(src)))]
    [(6, 'the loss comes from model.module(...), not from the wrapper')]
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.sharded_models import names_returned_by

__all__ = ["bypassed_forwards", "bypassing_parameters", "passed_bypasses"]

_Func = ast.FunctionDef | ast.AsyncFunctionDef
_NO_GRAD = frozenset({"no_grad", "inference_mode"})
_WRAPPERS = frozenset({"DistributedDataParallel", "DDP"})
# What Fabric's wrapper itself runs through the strategy's forward (``_FabricModule.__getattr__``)
_STEPS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})
# nn.Module methods that run no forward (a Fabric wrapper passes them to the module as is)
_MODULE_METHODS = frozenset(
    {
        "parameters", "named_parameters", "buffers", "named_buffers", "children", "modules",
        "named_modules", "state_dict", "load_state_dict", "train", "eval", "to", "cuda", "cpu",
        "zero_grad", "requires_grad_", "apply", "half", "float", "bfloat16", "double", "type",
        "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
        "get_submodule", "get_parameter", "extra_repr", "no_sync", "forward",
    }
)  # fmt: skip


def _backward_losses(call: ast.Call) -> list[ast.expr]:
    """The loss(es) a backward differentiates: ``loss`` of ``loss.backward()``,
    ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``,
    ``torch.autograd.backward(loss)``; empty for any other call."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr != "backward":
        return []
    owner = func.value
    if call.args and not (isinstance(owner, ast.Name) and owner.id == "loss"):
        receiver = tail(dotted(owner)).lower()
        if receiver in ("accelerator", "fabric", "autograd", "engine"):
            return [call.args[0]]
    if isinstance(owner, ast.Call) and tail(dotted(owner.func)) == "scale" and owner.args:
        return [owner.args[0]]
    return [owner]


def _assignments(facts: ModuleFacts, scope: Scope) -> list[tuple[set[str], ast.expr, int]]:
    """Each assignment of the function: its target names, value and line (source order)."""
    key = ("gt020-assignments", id(scope.node))
    cached = facts.memo.get(key)
    if isinstance(cached, list):
        return cached
    found: list[tuple[set[str], ast.expr, int]] = []
    for node in facts.scope_nodes.get(scope.node, []):
        targets: list[ast.expr]
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets = [node.target]
        else:
            continue
        names = {
            name
            for t in targets
            for sub in ast.walk(t)
            if isinstance(sub, (ast.Name, ast.Attribute)) and (name := dotted(sub)) is not None
        }
        value = node.value
        assert value is not None
        found.append((names, value, node.lineno))
    facts.memo[key] = found
    return found


def _augmented(facts: ModuleFacts, scope: Scope, line: int) -> bool:
    return any(
        isinstance(n, ast.AugAssign) and n.lineno == line
        for n in facts.scope_nodes.get(scope.node, [])
    )


def _loss_calls(facts: ModuleFacts, scope: Scope, loss: ast.expr, line: int) -> Iterator[ast.Call]:
    """Every call the loss is computed from: in ``loss`` itself and, through the names it
    reads, in the assignments of those names before ``line`` (a few steps back)."""
    assigns = _assignments(facts, scope)
    seen: set[str] = set()
    todo: list[tuple[ast.expr, int, int]] = [(loss, line, 0)]
    while todo:
        expr, before, depth = todo.pop()
        for node in ast.walk(expr):
            if isinstance(node, ast.Call):
                yield node
            key = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if key is None or key in seen or depth >= 5:
                continue
            seen.add(key)
            earlier = [(v, at) for names, v, at in assigns if key in names and at < before]
            for value, at in reversed(earlier):  # the last binding; through `loss += aux`
                todo.append((value, at, depth + 1))  # to the binding it adds to
                if not _augmented(facts, scope, at):
                    break


def _unwrapped_receiver(call: ast.Call) -> tuple[ast.expr, str] | None:
    """``(W, shown)`` for a call that runs the module inside wrapper ``W``:
    ``W.module(x)``, ``W.module.f(x)``, ``unwrap_model(W)(x)``, ``unwrap_model(W).f(x)``."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "module":
        return func.value, f"{ast.unparse(func)}(...)"
    if isinstance(func, ast.Attribute) and func.attr not in _MODULE_METHODS:
        inner = func.value
        if isinstance(inner, ast.Attribute) and inner.attr == "module":
            return inner.value, f"{ast.unparse(func)}(...)"
        func = inner
    if isinstance(func, ast.Call) and tail(dotted(func.func)) == "unwrap_model" and func.args:
        return func.args[0], f"{ast.unparse(call.func)}(...)"
    return None


def _is_ddp(facts: ModuleFacts, expr: ast.expr, scope: Scope, prepared: bool) -> bool:
    """A DDP wrapper by its bindings (on any path of the function), or a model an
    Accelerator prepared in a file whose Accelerator wraps in DDP (``prepared``)."""
    values: list[ast.expr | None] = [expr]
    key = dotted(expr)
    if key is not None:
        values += facts.lookup_all(key, scope)
    for value in values:
        if value is None:
            continue
        if facts.kinds(value, scope) & {"ddp"}:
            return True
    return (
        prepared
        and key is not None
        and key in names_returned_by(facts, ("prepare",), "accelerator")
    )


def _runs_wrapper(facts: ModuleFacts, scope: Scope, wrapper: str) -> bool:
    """Whether the function calls the wrapper's own forward (``model(x)``, ``model.forward``)."""
    for node in facts.scope_nodes.get(scope.node, []):
        if isinstance(node, ast.Call) and dotted(node.func) in (wrapper, f"{wrapper}.forward"):
            return True
    return False


def _no_grad_lines(facts: ModuleFacts, scope: Scope) -> list[tuple[int, int]]:
    spans = []
    for node in facts.scope_nodes.get(scope.node, []):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                ctx = item.context_expr
                if isinstance(ctx, ast.Call) and tail(call_name(ctx, facts.imports)) in _NO_GRAD:
                    spans.append((node.lineno, node.end_lineno or node.lineno))
    return spans


def _backwards(facts: ModuleFacts) -> Iterator[tuple[ast.Call, ast.expr, Scope]]:
    for call in facts.calls:
        for loss in _backward_losses(call):
            yield call, loss, facts.scope_containing(call)


def _bypasses(
    facts: ModuleFacts, is_wrapper: Callable[[ast.expr, Scope], bool]
) -> Iterator[tuple[ast.Call, ast.expr, str, Scope]]:
    """``(call, wrapper, shown, scope)`` for each call a backward's loss comes from that runs
    the module inside a wrapper ``is_wrapper`` accepts, in a function running no forward of
    that wrapper."""
    for backward, loss, scope in _backwards(facts):
        quiet = _no_grad_lines(facts, scope)
        for call in _loss_calls(facts, scope, loss, backward.lineno):
            found = _unwrapped_receiver(call)
            if found is None or any(a <= call.lineno <= b for a, b in quiet):
                continue
            wrapper, shown = found
            name = dotted(wrapper)
            if name is None or _runs_wrapper(facts, scope, name):
                continue
            if is_wrapper(wrapper, scope):
                yield call, wrapper, shown, scope


def _unmoved(expr: ast.expr) -> ast.expr:
    """``policy`` of ``policy.cuda()`` / ``policy.to(device)``: the module a wrapper gets."""
    while (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr in ("to", "cuda", "cpu", "float", "half", "bfloat16", "train")
    ):
        expr = expr.func.value
    return expr


def _made_from(facts: ModuleFacts, scope: Scope, before: int) -> dict[str, str]:
    """Names passed to ``DDP(...)`` in the function before line ``before`` -> the wrapper's
    name (a warm-up backward before the wrapper exists is a plain one)."""
    made: dict[str, str] = {}
    for names, value, line in _assignments(facts, scope):
        if line >= before or not isinstance(value, ast.Call) or not value.args:
            continue
        inner = dotted(_unmoved(value.args[0]))
        if inner is not None and tail(call_name(value, facts.imports)) in _WRAPPERS:
            made.update((inner, name) for name in names if name != inner)
    return made


def bypassed_forwards(
    facts: ModuleFacts, *, prepared: bool = False, fabric: bool = False
) -> list[tuple[ast.AST, str]]:
    """``GT020`` findings of a module: each call a loss comes from that skips the wrapper.

    Args:
        facts: The module's facts.
        prepared: The file's Accelerator wraps in DDP (its prepared models are DDP wrappers).
        fabric: The file sets its models up with Lightning Fabric.

    Returns:
        ``(node, detail)`` pairs, in source order.
    """
    found: dict[int, tuple[ast.AST, str]] = {}
    for call, _, shown, _ in _bypasses(facts, lambda w, s: _is_ddp(facts, w, s, prepared)):
        why = f"the loss comes from {shown}, not from the wrapper"
        found.setdefault(id(call), (call, why))
    for backward, loss, scope in _backwards(facts):
        made = _made_from(facts, scope, backward.lineno)
        if not made:
            continue
        for call in _loss_calls(facts, scope, loss, backward.lineno):
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr in _MODULE_METHODS:
                continue  # `policy.bfloat16()`, `net.to(device)`: no forward
            owner = func.value if isinstance(func, ast.Attribute) else func
            inner = dotted(owner)
            if inner in made and not _runs_wrapper(facts, scope, made[inner]):
                why = f"the loss comes from {inner}; {made[inner]} = DDP({inner}) never runs"
                found.setdefault(id(call), (call, why))
    for call, why in passed_bypasses(facts, prepared=prepared):
        found.setdefault(id(call), (call, why))
    for call, why in _unwrapped_arguments(facts, prepared):
        found.setdefault(id(call), (call, why))
    if fabric and not any(tail(dotted(c.func)) == "mark_forward_method" for c in facts.calls):
        for call, why in _fabric_methods(facts):
            found.setdefault(id(call), (call, why))
    return sorted(found.values(), key=lambda f: (getattr(f[0], "lineno", 0), f[1]))


def _fabric_methods(facts: ModuleFacts) -> Iterator[tuple[ast.Call, str]]:
    """A method other than ``forward`` called on a model ``fabric.setup`` returned, whose
    result a backward's loss comes from (Fabric sends ``training_step`` and the other
    LightningModule step methods through the wrapper's forward itself), or any call on its
    ``.module`` (the original module)."""
    for backward, loss, scope in _backwards(facts):
        for call in _loss_calls(facts, scope, loss, backward.lineno):
            func = call.func
            if not isinstance(func, ast.Attribute) or func.attr in _MODULE_METHODS | _STEPS:
                continue
            if isinstance(func.value, ast.Attribute) and func.value.attr == "module":
                func = func.value  # `model.module.loss(x)`: the original module's method
            key = dotted(func.value)
            if key is None or _runs_wrapper(facts, scope, key):
                continue
            if key in names_returned_by(facts, ("setup", "setup_module"), "fabric"):
                yield call, f"{ast.unparse(call.func)}() runs the module past Fabric's wrapper"


def bypassing_parameters(facts: ModuleFacts, func: _Func) -> tuple[int, ...]:
    """The positions of ``func``'s parameters whose module a backward's loss is computed on
    (``param.module(x)``), the parameter's own forward never called there (``self`` aside:
    the positions of the call's arguments)."""
    key = "gt020-parameters"
    cached = facts.memo.get(key)
    if isinstance(cached, dict):
        return tuple(sorted(cached.get(id(func), ())))
    table: dict[int, set[int]] = {}
    for _, wrapper, _, scope in _bypasses(facts, lambda w, s: isinstance(w, ast.Name)):
        node = scope.node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
        name = dotted(wrapper)
        if name in params:
            offset = 1 if params[0] in ("self", "cls") else 0
            if params.index(name) >= offset:
                table.setdefault(id(node), set()).add(params.index(name) - offset)
    facts.memo[key] = table
    return tuple(sorted(table.get(id(func), ())))


def passed_bypasses(facts: ModuleFacts, *, prepared: bool = False) -> list[tuple[ast.Call, str]]:
    """Calls handing a DDP wrapper to a function of the project that computes its loss on
    the wrapper's module (``fit(model, ...)`` with ``model.module.loss(x)`` inside)."""
    found = []
    for call in facts.calls:
        refs = facts.callees(call)
        for callee_facts, func in refs:
            for position in bypassing_parameters(callee_facts, func):
                if position < len(call.args):
                    arg = call.args[position]
                    if _is_ddp(facts, arg, facts.scope_containing(call), prepared):
                        where = (
                            f"{func.name}() ({callee_facts.path.rsplit('/', 1)[-1]}:{func.lineno})"
                        )
                        why = f"{where} computes its loss on {ast.unparse(arg)}.module"
                        found.append((call, why))
                        break
    return found


def _unwrapped_arguments(facts: ModuleFacts, prepared: bool) -> Iterator[tuple[ast.Call, str]]:
    """A loss computed by a function of the project handed the module inside a DDP wrapper
    (``loss = compute_loss(accelerator.unwrap_model(model), batch)``, ``fit(model.module,
    ...)``) that runs it (``system(x)``, ``system.encode(x)``), in a function that runs no
    forward of the wrapper itself."""
    for backward, loss, scope in _backwards(facts):
        for call in _loss_calls(facts, scope, loss, backward.lineno):
            passed: list[tuple[int | str, ast.expr]] = list(enumerate(call.args))
            passed += [(k.arg, k.value) for k in call.keywords if k.arg is not None]
            for slot, arg in passed:
                wrapper = _inner_of(arg)
                name = None if wrapper is None else dotted(wrapper)
                if wrapper is None or name is None or _runs_wrapper(facts, scope, name):
                    continue
                if not _is_ddp(facts, wrapper, scope, prepared):
                    continue
                if any(_runs_parameter(f, func, slot) for f, func in facts.callees(call)):
                    shown = f"{ast.unparse(call.func)}({ast.unparse(arg)}, ...)"
                    yield call, f"the loss comes from {shown}: the module inside the wrapper"
                    break


def _inner_of(arg: ast.expr) -> ast.expr | None:
    """``W`` of ``accelerator.unwrap_model(W)`` or ``W.module``."""
    if isinstance(arg, ast.Attribute) and arg.attr == "module":
        return arg.value
    if isinstance(arg, ast.Call) and tail(dotted(arg.func)) == "unwrap_model" and arg.args:
        return arg.args[0]
    return None


def _runs_parameter(facts: ModuleFacts, func: _Func, slot: int | str) -> bool:
    """Whether ``func`` runs a forward of the parameter a call's argument ``slot`` (a
    position, ``self`` aside, or a keyword) binds: ``param(x)`` or ``param.encode(x)``."""
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    if isinstance(slot, int):
        offset = 1 if params and params[0] in ("self", "cls") else 0
        if slot + offset >= len(params):
            return False
        name = params[slot + offset]
    else:
        name = slot
    for node in facts.scope_nodes.get(func, []):
        if isinstance(node, ast.Call):
            called = dotted(node.func)
            if called == name:
                return True
            method = called.rsplit(".", 1)[1] if called and called.startswith(name + ".") else ""
            if method and method not in _MODULE_METHODS:
                return True
    return False
