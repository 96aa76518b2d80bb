"""``GT019``: bf16 parameters stepped by ``torch.optim.Adam``/``AdamW``, with no fp32 master copy;
``GT011``: a ``GradScaler`` whose every autocast is bfloat16 (:func:`scalers_with_bf16`).

bfloat16 keeps 8 bits of mantissa: a weight of 1e-2 cannot move by less than about 4e-5, and
Adam's update is ``lr`` (1e-4 .. 1e-5) times a ratio near 1, so most updates round to nothing
and training stalls while the loss looks merely slow. Mixed precision keeps the parameters in
fp32 and computes in bf16 (``autocast``, FSDP's ``MixedPrecision(param_dtype=...)``, DeepSpeed's
and Accelerate's bf16 modes); the pitfall is converting the module itself (``model.to(
torch.bfloat16)``, ``model.bfloat16()``, ``from_pretrained(..., torch_dtype=torch.bfloat16)``,
``torch.set_default_dtype(torch.bfloat16)``) and handing its parameters to ``torch.optim``.

What counts: the module named by the conversion (the dtype written out or held in a name,
``dtype = torch.bfloat16`` ... ``torch_dtype=dtype``) and the first argument of ``Adam``/``AdamW``
(``model.parameters()``, a list of groups built from it) in the same function, or anywhere in
the file for ``set_default_dtype``. The optimizer class may be reached through a name, a
``functools.partial`` or a conditional expression (``opt_cls = partial(AdamW, ...) if adamw else
SGD``). Not flagged: an optimizer of another package (bitsandbytes, ``AnyPrecisionAdamW``
with Kahan summation), a file handing the model to DeepSpeed (fp32 master weights of its own)
or Accelerate's FSDP or DeepSpeed plugin (FSDP upcasts the sharded parameters to fp32 under
mixed precision; a script that reads its Accelerator's ``deepspeed_plugin`` or builds
``DummyOptim`` is run under DeepSpeed, and so is an Accelerator whose repository's every
multi-process Accelerate config is ``DEEPSPEED``), a conversion back (``.float()``,
``.to(torch.float32)``) of the module.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> source = ("import torch\\nmodel = Net().to(torch.bfloat16)\\n"
    ...           "opt = torch.optim.AdamW(model.parameters(), lr=1e-4)\\n")
    >>> facts = ModuleFacts(ast.parse(source))
    >>> [(call.lineno, detail) for call, detail in bf16_adam(facts)]
    [(3, 'model is bfloat16 (line 2: Net().to(torch.bfloat16)); AdamW keeps no fp32 copy')]
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from gpu_training.diagnostics.lint.bf16_models import conversion, dtype_of, scope_dtypes
from gpu_training.diagnostics.lint.calls import is_const, keyword_arg, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.sharded_models import accelerate_sharding, accelerate_unsharded

__all__ = ["bf16_adam", "conversion", "scalers_with_bf16"]

_ADAM = frozenset({"Adam", "AdamW"})
_UPCASTING_PLUGINS = frozenset({"FullyShardedDataParallelPlugin", "DeepSpeedPlugin"})
_DEEPSPEED_MARKS = frozenset({"deepspeed_plugin", "DEEPSPEED"})
_DUMMIES = frozenset({"DummyOptim", "DummyScheduler"})
_METADATA = frozenset({"config", "shape", "dtype", "device"})  # a module's, not its parameters


def _mentioned(expr: ast.expr, facts: ModuleFacts, scope: Scope, depth: int = 0) -> set[str]:
    """The names an expression reads, through the names it reads (``groups = [{"params":
    model.parameters()}]``; ``AdamW(groups)`` reads ``model``), and what is added to them
    (``params += list(decoder.parameters())``)."""
    found: set[str] = set()
    for node in _reads(expr):
        if isinstance(node, (ast.Name, ast.Attribute)):
            key = dotted(node)
            if key is None:
                continue
            found.add(key)
            if (isinstance(node, ast.Name) or key.startswith("self.")) and depth < 3:
                at = (node.lineno, node.col_offset)
                values = facts.lookup(key, scope, at) + _augmented(facts, key, scope, at)
                for value in values:
                    if value is not None and value is not expr:
                        found |= _mentioned(value, facts, scope, depth + 1)
    return found


def _augmented(
    facts: ModuleFacts, key: str, scope: Scope, at: tuple[int, int]
) -> list[ast.expr | None]:
    """What ``params += list(head.parameters())`` adds to a name before ``at``, and what the
    name held before each such line (a binding reads as unknown past an augmented one)."""
    found: list[ast.expr | None] = []
    for node in facts.scope_nodes.get(scope.node, []):
        if isinstance(node, ast.AugAssign) and dotted(node.target) == key:
            where = (node.lineno, node.col_offset)
            if where < at:
                found += [node.value, *facts.lookup(key, scope, where)]
    return found


def _adam_class(
    expr: ast.expr, facts: ModuleFacts, scope: Scope, pos: tuple[int, int], depth: int = 0
) -> str | None:
    """The ``torch.optim`` Adam/AdamW class a callee may be, or None: the class itself, a name
    bound to it (``opt_cls = torch.optim.AdamW``), a ``functools.partial`` of it, or either
    branch of a conditional expression (``partial(AdamW, ...) if args.optim == "adamw" else
    SGD``: the run that takes that branch steps with Adam)."""
    if isinstance(expr, ast.IfExp):
        return _adam_class(expr.body, facts, scope, pos, depth) or _adam_class(
            expr.orelse, facts, scope, pos, depth
        )
    if isinstance(expr, ast.Call):
        partial = call_name(expr, facts.imports) == "functools.partial"
        return (
            _adam_class(expr.args[0], facts, scope, pos, depth) if partial and expr.args else None
        )
    key = dotted(expr)
    name = facts.imports.resolve(key)
    if key is None or name is None:
        return None
    if name.startswith("torch.optim.") and tail(name) in _ADAM:
        return name
    if depth < 3 and (isinstance(expr, ast.Name) or key.startswith("self.")):
        for value in facts.lookup(key, scope, pos):
            if value is not None and value is not expr:
                found = _adam_class(value, facts, scope, pos, depth + 1)
                if found is not None:
                    return found
    return None


def _reads(expr: ast.expr) -> Iterator[ast.AST]:
    """The nodes of ``expr``, less what a read of a module's metadata holds: a number or a
    config read off a module (``Proj(width=encoder.config.projection_dim)``) carries none of
    its parameters, so the module it is read from is not mentioned."""
    stack: list[ast.AST] = [expr]
    while stack:
        node = stack.pop()
        key = dotted(node) if isinstance(node, ast.Attribute) else None
        if key is not None and not _METADATA.isdisjoint(key.split(".")[1:]):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _bf16_argument(facts: ModuleFacts, func: ast.AST, mentioned: set[str]) -> str | None:
    """The optimizer is built in a helper (``def get_optimizer(model, lr): return
    AdamW(model.parameters())``) over a parameter that a call of the file hands a bf16 model
    (``optimizer = get_optimizer(model, lr)`` after ``model = from_pretrained(...,
    torch_dtype=torch.bfloat16)``): the evidence, or None."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    sites = [(facts, call, scope) for call, scope in facts.calls_of(func)]
    if facts.resolver is not None:  # `optimizer = get_optimizer(model, ...)` in another module
        sites += facts.resolver.incoming((facts, func))
    for owner, call, scope in sites:
        offset = 1 if params[:1] == ["self"] and isinstance(call.func, ast.Attribute) else 0
        handed = {
            params[i + offset]: a for i, a in enumerate(call.args) if i + offset < len(params)
        }
        handed |= {k.arg: k.value for k in call.keywords if k.arg is not None}
        bf16, fp32 = scope_dtypes(owner, scope.node)
        for param, arg in handed.items():
            key = dotted(arg)
            if param in mentioned and key in bf16 and key not in fp32:
                return f"{key} is bfloat16 ({bf16[key]}) and handed to {func.name} (line {call.lineno})"
    return None


def _runs_under_deepspeed(facts: ModuleFacts) -> bool:
    """The file is written to run under Accelerate's DeepSpeed backend, chosen by the launch
    config: it reads ``accelerator.state.deepspeed_plugin``, compares the distributed type
    with ``DistributedType.DEEPSPEED``, or builds ``DummyOptim``/``DummyScheduler`` (which
    stand in for the optimizer of a DeepSpeed config). Not when the repository's Accelerate
    configs all launch without DeepSpeed (``distributed_type: MULTI_GPU``): the comparison is
    then boilerplate of a save hook that never takes the DeepSpeed branch."""
    if accelerate_unsharded(facts):
        return False
    for node in facts.nodes:
        if isinstance(node, ast.Attribute) and node.attr in _DEEPSPEED_MARKS:
            return True
        if isinstance(node, ast.Call) and tail(call_name(node, facts.imports)) in _DUMMIES:
            return True
    return False


def bf16_adam(facts: ModuleFacts) -> list[tuple[ast.Call, str]]:
    """``GT019``: the ``torch.optim.Adam``/``AdamW`` constructions over bf16 parameters.

    Args:
        facts: The file's facts.

    Returns:
        ``(the optimizer call, evidence)`` pairs.
    """
    calls = facts.calls
    names = {call_name(c, facts.imports) for c in calls}
    if (
        any(n.startswith("deepspeed.") for n in names)
        or any(tail(n) in _UPCASTING_PLUGINS for n in names)
        or _runs_under_deepspeed(facts)
        or accelerate_sharding(facts) == "deepspeed"  # the repository's Accelerate configs
    ):
        # DeepSpeed keeps fp32 master weights of its own; Accelerate's FSDP upcasts the
        # low-precision parameters it shards to fp32 when mixed precision is on
        return []
    default_bf16 = next(
        (
            c
            for c in calls
            if tail(call_name(c, facts.imports)) == "set_default_dtype"
            and c.args
            and dtype_of(c.args[0], facts) == "bfloat16"
        ),
        None,
    )
    found: list[tuple[ast.Call, str]] = []
    for scope_node, nodes in facts.scope_nodes.items():
        scope = facts.scopes[scope_node]
        adams = [
            (call, name)
            for call in nodes
            if isinstance(call, ast.Call)
            and (name := _adam_class(call.func, facts, scope, (call.lineno, call.col_offset)))
        ]
        if not adams:
            continue
        bf16, fp32 = scope_dtypes(facts, scope_node)
        for call, name in adams:
            params = call.args[0] if call.args else keyword_arg(call, "params")
            if params is None:
                continue
            mentioned = _mentioned(params, facts, scope)
            hit = next((m for m in sorted(bf16) if m in mentioned and m not in fp32), None)
            if hit is not None:
                found.append(
                    (call, f"{hit} is bfloat16 ({bf16[hit]}); {tail(name)} keeps no fp32 copy")
                )
            elif (handed := _bf16_argument(facts, scope_node, mentioned)) is not None:
                found.append((call, f"{handed}; {tail(name)} keeps no fp32 copy"))
            elif default_bf16 is not None and not bf16 and not fp32:
                found.append(
                    (
                        call,
                        f"torch.set_default_dtype(torch.bfloat16) (line {default_bf16.lineno}) "
                        f"makes the parameters bfloat16; {tail(name)} keeps no fp32 copy",
                    )
                )
    return found


def scalers_with_bf16(calls: list[ast.Call], facts: ModuleFacts) -> list[ast.Call]:
    """``GT011``: the enabled ``GradScaler`` calls whose every autocast is bfloat16.

    A scaler kept in a local variable is read with the autocasts of its function and of the
    functions it is passed to (none there: an fp32 loop, not the bf16 pitfall); any other
    scaler (``self.scaler``, a module global, one returned) with every autocast of the file.

    Args:
        calls: Every call of the file.
        facts: The file's facts.

    Returns:
        The scaler constructions to report.
    """
    file_dtypes = {_autocast_dtype(c, facts) for c in calls if _is_autocast(c, facts)}
    found = []
    for call in calls:
        if tail(call_name(call, facts.imports)) not in ("GradScaler", "ShardedGradScaler"):
            continue
        enabled = keyword_arg(call, "enabled")
        if enabled is not None and not is_const(enabled, True):
            continue
        local = _local_reach(call, facts)
        dtypes = file_dtypes if local is None else local
        if dtypes == {"bfloat16"}:
            found.append(call)
    return found


def _is_autocast(call: ast.Call, facts: ModuleFacts) -> bool:
    return tail(call_name(call, facts.imports)) == "autocast"


def _autocast_dtype(call: ast.Call, facts: ModuleFacts) -> str:
    dtype = keyword_arg(call, "dtype")
    if dtype is None and len(call.args) > 1 and "torch.autocast" in call_name(call, facts.imports):
        dtype = call.args[1]
    return _dtype_name(dtype, facts)


def _local_reach(scaler: ast.Call, facts: ModuleFacts) -> set[str] | None:
    """The autocast dtypes where a scaler bound to a local name is used: its function's and
    those of the functions it is passed to; None when the scaler leaves the function."""
    scope = facts.scope_containing(scaler)
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    name = next(
        (
            t.id
            for n in ast.walk(func)
            if isinstance(n, ast.Assign) and n.value is scaler
            for t in n.targets
            if isinstance(t, ast.Name)
        ),
        None,
    )
    if name is None or any(  # `return scaler`, `self.scaler = scaler`: used elsewhere
        (isinstance(n, ast.Return) and n.value is not None and _names(n.value, name))
        or (isinstance(n, ast.Assign) and n.value is not scaler and _names(n.value, name))
        for n in ast.walk(func)
    ):
        return None
    reached = [func]
    for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
        passed = [*call.args, *(k.value for k in call.keywords)]
        if any(isinstance(a, ast.Name) and a.id == name for a in passed):
            reached += facts.local_functions(call)
    return {
        _autocast_dtype(c, facts)
        for f in reached
        for c in ast.walk(f)
        if isinstance(c, ast.Call) and _is_autocast(c, facts)
    }


def _names(expr: ast.expr, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(expr))


def _dtype_name(expr: ast.expr | None, facts: ModuleFacts) -> str:
    if expr is None:
        return "default"
    name = facts.imports.resolve(dotted(expr))
    if isinstance(expr, ast.Name) and name == expr.id:
        values = [v for s in facts.scopes.values() for _, v in s.bindings.get(expr.id, [])]
        resolved = {facts.imports.resolve(dotted(v)) for v in values if v is not None}
        if len(resolved) == 1:
            name = resolved.pop()
    last = tail(name)
    return {"half": "float16", "bf16": "bfloat16"}.get(last, last or "unknown")
