"""Where a module's parameters become bfloat16 (``GT019``), read the way a run sets them.

A script rarely writes ``model.to(torch.bfloat16)`` with the dtype spelled out: the dtype is
chosen from a precision setting (``self.dtype = torch.bfloat16`` under ``if precision ==
"bf16":``, ``{"bf16": torch.bfloat16, ...}[args.precision]``, ``torch.bfloat16 if args.bf16
else torch.float32``), handed to ``from_pretrained`` through a keyword dict (``kwargs[
"torch_dtype"] = torch.bfloat16`` ... ``from_pretrained(path, **kwargs)``), and the conversion
sits in a helper of another module (``model, tok = load_model(cfg)`` whose body loads in bf16
and returns the model) or in the model class itself (``self.to(torch.bfloat16)`` at the end of
its ``__init__``), the model being a field of a config object (``model: Net = Net()``).

A dtype counts as bfloat16 when bfloat16 is one of the values the setting may hold: the
configuration that picks it trains bf16 weights (a flag-dependent path is still the pitfall).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> source = ("import torch\\n"
    ...           "dtype = torch.bfloat16 if args.bf16 else torch.float32\\n"
    ...           "net = Net().to(dtype)\\n")
    >>> facts = ModuleFacts(ast.parse(source))
    >>> bf16, fp32 = scope_dtypes(facts, facts.tree)
    >>> sorted(bf16), sorted(fp32)
    (['net'], [])
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import keyword_arg, parents
from gpu_training.diagnostics.lint.model import ModuleFacts, dotted
from gpu_training.diagnostics.lint.peft_dtypes import parameters_owner, peft_wrapped

__all__ = ["bound_name", "conversion", "dtype_of", "scope_dtypes"]

_FP32 = frozenset({"float32", "float"})
_DTYPE_KEYS = ("torch_dtype", "dtype")
_SAME_MODULE = frozenset({"to", "cuda", "train", "eval", "requires_grad_", "to_empty"})
"""Methods that return the module itself (a ``.to(torch.float32)`` among them is a conversion
of its own, read at that call)."""
_MAX_DEPTH = 2
"""Helpers of helpers followed: ``main`` → ``build`` → ``load`` (the call that converts)."""


def dtype_of(expr: ast.expr | None, facts: ModuleFacts, depth: int = 0) -> str | None:
    """``"bfloat16"`` for ``torch.bfloat16`` (or ``"bf16"``), ``"float32"``…, through a name
    or ``self`` attribute bound to one of them (bfloat16 on any branch wins: the setting that
    picks it), a conditional expression or a dict of dtypes indexed by a setting; None:
    unknown."""
    if expr is None:
        return None
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32"}.get(expr.value)
    if depth > 3:
        return None
    if isinstance(expr, ast.IfExp):  # `torch.bfloat16 if args.bf16 else torch.float32`
        return _one_of([expr.body, expr.orelse], facts, depth)
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Dict):
        return _one_of([v for v in expr.value.values if v is not None], facts, depth)
    name = facts.imports.resolve(dotted(expr)) or ""
    if name.startswith("torch.") and not isinstance(expr, ast.Name):
        return name.rsplit(".", 1)[-1]
    key = dotted(expr)
    if key is not None and (isinstance(expr, ast.Name) or key.startswith("self.")):
        values = facts.lookup_all(key, facts.scope_containing(expr))  # every branch's
        kinds = {dtype_of(v, facts, depth + 1) for v in values}
        if "bfloat16" in kinds:
            return "bfloat16"
        if len(kinds) == 1 and values and all(v is not None for v in values):
            return kinds.pop()
    if isinstance(expr, ast.Name) and name.startswith("torch."):  # `from torch import bfloat16`
        return name.rsplit(".", 1)[-1]
    return None


def _one_of(values: list[ast.expr], facts: ModuleFacts, depth: int) -> str | None:
    kinds = {dtype_of(v, facts, depth + 1) for v in values}
    if "bfloat16" in kinds:
        return "bfloat16"
    return kinds.pop() if len(kinds) == 1 else None


def conversion(call: ast.Call, facts: ModuleFacts) -> tuple[str, ast.expr] | None:
    """``x.to(torch.bfloat16)``/``x.bfloat16()`` → ``("bfloat16", x)``; ``x.float()`` →
    ``("float32", x)``; ``from_pretrained(..., torch_dtype=torch.bfloat16)`` (or the key in a
    ``**kwargs`` dict; or any loader given ``torch_dtype=``, the keyword Hugging Face loaders
    take) → bfloat16 of the call itself."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr == "bfloat16" and not call.args:
        return "bfloat16", func.value
    if func.attr == "float" and not call.args:
        return "float32", func.value
    if func.attr == "to":
        dtype = keyword_arg(call, "dtype")
        candidates = [dtype] if dtype is not None else list(call.args)
        for candidate in candidates:
            kind = dtype_of(candidate, facts)
            if kind == "bfloat16" or kind in _FP32:
                return ("bfloat16" if kind == "bfloat16" else "float32"), func.value
    # `from_pretrained(..., torch_dtype=...)`, or a loader of the project that takes the same
    # keyword (`Model.from_pretrained_lopt(path, torch_dtype=dtype)`)
    if func.attr in ("from_pretrained", "from_config") or keyword_arg(call, "torch_dtype"):
        given = keyword_arg(call, "torch_dtype") or keyword_arg(call, "dtype")
        kind = dtype_of(given, facts) if given is not None else _splatted_dtype(call, facts)
        if kind == "bfloat16":
            return "bfloat16", call
    return None


def _splatted_dtype(call: ast.Call, facts: ModuleFacts) -> str | None:
    """The dtype a ``**kwargs`` dict hands to ``from_pretrained``: a dict literal or
    ``dict(...)`` with a ``torch_dtype`` key, or ``kwargs["torch_dtype"] = ...`` in the same
    function."""
    scope = facts.scope_containing(call)
    for keyword in call.keywords:
        if keyword.arg is not None or not isinstance(keyword.value, ast.Name):
            continue
        name = keyword.value.id
        values: list[ast.expr] = []
        for bound in facts.lookup_all(name, scope):
            if isinstance(bound, ast.Dict):
                values += [
                    v
                    for k, v in zip(bound.keys, bound.values, strict=True)
                    if isinstance(k, ast.Constant) and k.value in _DTYPE_KEYS
                ]
            elif isinstance(bound, ast.Call) and dotted(bound.func) == "dict":
                values += [k.value for k in bound.keywords if k.arg in _DTYPE_KEYS]
        for node in facts.scope_nodes.get(scope.node, []):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if (
                        isinstance(target, ast.Subscript)
                        and dotted(target.value) == name
                        and isinstance(target.slice, ast.Constant)
                        and target.slice.value in _DTYPE_KEYS
                    ):
                        values.append(node.value)
        if any(dtype_of(v, facts) == "bfloat16" for v in values):
            return "bfloat16"
    return None


def bound_name(call: ast.Call, facts: ModuleFacts) -> str | None:
    """The name a call's value is assigned to (``model = Net().to(torch.bfloat16)``), through
    the methods that hand the same module back in the same dtype (``from_pretrained(...,
    torch_dtype=torch.bfloat16).to("cuda")``, ``.cuda()``, ``.train()``)."""
    up = parents(facts)
    value: ast.expr = call
    parent = up.get(id(value))
    while isinstance(parent, ast.Attribute) and parent.attr in _SAME_MODULE:
        outer = up.get(id(parent))
        if not (isinstance(outer, ast.Call) and outer.func is parent):
            return None
        value, parent = outer, up.get(id(outer))
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        return dotted(parent.targets[0])
    if isinstance(parent, ast.AnnAssign):
        return dotted(parent.target)
    return None


def scope_dtypes(
    facts: ModuleFacts, scope_node: ast.AST, depth: int = 0
) -> tuple[dict[str, str], set[str]]:
    """The names a function (or the module) makes bfloat16, each with its evidence, and the
    names it converts back to fp32.

    Args:
        facts: The file's facts.
        scope_node: The ``def`` (or the module).
        depth: How many helper calls down this function is (helpers are followed to
            :data:`_MAX_DEPTH`).

    Returns:
        ``({name: "line N: the conversion"}, {names converted to fp32})``.
    """
    key = ("bf16-scope", id(scope_node))
    if depth == 0 and key in facts.memo:
        cached = facts.memo[key]
        assert isinstance(cached, tuple)
        return cached
    bf16: dict[str, str] = {}
    fp32: set[str] = set()
    adapters: set[str] = set()  # trained through fp32 PEFT adapters
    nodes = facts.scope_nodes.get(scope_node, [])
    for call in (n for n in nodes if isinstance(n, ast.Call)):
        adapters |= peft_wrapped(call, facts, scope_node, bound_name)
        converted = conversion(call, facts)
        if converted is None:
            continue
        kind, target = converted
        names_of = {dotted(target), bound_name(call, facts)} - {None}
        if isinstance(target, ast.Call):  # `Net().to(torch.bfloat16)` bound to a name
            names_of = {bound_name(call, facts)} - {None}
        owner = parameters_owner(target, facts)  # `param.data = param.data.to(bf16)` in a loop
        if owner is not None:
            names_of.add(owner)
            adapters.discard(owner)  # the adapters themselves made bf16 again
        for name in names_of:
            assert name is not None
            if kind == "bfloat16":
                bf16.setdefault(name, f"line {call.lineno}: {ast.unparse(call)[:60]}")
            else:
                fp32.add(name)
    fp32 |= adapters
    if depth < _MAX_DEPTH and facts.resolver is not None:
        for name, evidence in _helper_made(facts, nodes, depth).items():
            bf16.setdefault(name, evidence)
    if depth == 0:
        facts.memo[key] = (bf16, fp32)
    return bf16, fp32


def _helper_made(facts: ModuleFacts, nodes: list[ast.AST], depth: int) -> dict[str, str]:
    """Names bound to what a project helper returns in bfloat16 (``model, tok =
    load(cfg)``), to an object of a class that converts itself in ``__init__``, or to a
    config field holding such an object (``model = cfg.model``, ``model: Net = Net()``)."""
    found: dict[str, str] = {}
    for node in nodes:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        while (  # `load(cfg).cuda()`: the same module
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in _SAME_MODULE
            and isinstance(value.func.value, ast.Call)
        ):
            value = value.func.value
        made: dict[int | None, str] = {}
        if isinstance(value, ast.Call):
            made = _made_by(facts, value.func, depth)
        elif isinstance(value, ast.Attribute):
            for field in _fields(facts, value.attr):
                made = made or _made_by(facts, field, depth)
        where = f"line {node.lineno}: {ast.unparse(node.value)[:40]}"
        if isinstance(target, ast.Tuple):
            for index, element in enumerate(target.elts):
                key = dotted(element)
                if index in made and key is not None:
                    found.setdefault(key, f"{where}, {made[index]}")
        elif None in made and dotted(target) is not None:
            found.setdefault(dotted(target) or "", f"{where}, {made[None]}")
    return found


def _fields(facts: ModuleFacts, attr: str) -> list[ast.expr]:
    """What a class of the file declares for a field (``model: Net = Net("16k")``): the
    constructor it defaults to and the class it is annotated with."""
    found: list[ast.expr] = []
    for node in facts.nodes:
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and dotted(stmt.target) == attr:
                if isinstance(stmt.value, ast.Call):
                    found.append(stmt.value.func)
                found.append(stmt.annotation)
    return found


def _made_by(facts: ModuleFacts, func: ast.expr, depth: int) -> dict[int | None, str]:
    """What a project callable hands back in bfloat16: ``{None: evidence}`` for the whole
    value, ``{i: evidence}`` for the i-th element of a returned tuple."""
    resolver = facts.resolver
    if resolver is None or isinstance(func, ast.Constant):
        return {}
    made: dict[int | None, str] = {}
    for module, callee in resolver.callees(facts, func):
        scope = module.scope_of(callee)
        if callee.name == "__init__" and scope.cls is not None:
            cast = _self_cast(module, callee) or _built_in_bf16(module, callee, depth)
            if cast is not None:
                made.setdefault(None, cast)
            continue
        for index, evidence in _returned(module, callee, depth + 1).items():
            made.setdefault(index, evidence)
    return made


def _self_cast(module: ModuleFacts, init: ast.AST) -> str | None:
    """Where an ``__init__`` converts its own object to bfloat16 (``self.to(dtype=
    self.dtype)`` with ``self.dtype = torch.bfloat16``, ``self.bfloat16()``)."""
    for call in (n for n in module.scope_nodes.get(init, []) if isinstance(n, ast.Call)):
        converted = conversion(call, module)
        if converted is not None and converted[0] == "bfloat16" and dotted(converted[1]) == "self":
            return f"bfloat16 in its __init__ ({_place(module, call)})"
    return None


def _built_in_bf16(module: ModuleFacts, func: ast.AST, depth: int) -> str | None:
    """Where a constructor (or a project helper or class it calls) builds its layers in
    bfloat16: ``nn.Linear(d, d, dtype=torch.bfloat16)``, ``nn.Parameter(torch.randn(n,
    dtype=torch.bfloat16))`` — the object's own parameters are bf16 from the start."""
    for call in (n for n in module.scope_nodes.get(func, []) if isinstance(n, ast.Call)):
        origin = module.imports.resolve(dotted(call.func)) or ""
        if origin.startswith("torch.nn.") and _makes_bf16(call, module):
            return f"layers built in bfloat16 ({_place(module, call)})"
        if depth < _MAX_DEPTH and module.resolver is not None and not origin.startswith("torch"):
            for inner, callee in module.callees(call):
                if callee is not func:
                    found = _built_in_bf16(inner, callee, depth + 1)
                    if found is not None:
                        return found
    return None


def _makes_bf16(call: ast.Call, module: ModuleFacts) -> bool:
    """``nn.Linear(..., dtype=bf16)`` or ``nn.Parameter(torch.zeros(..., dtype=bf16))``."""
    if dtype_of(keyword_arg(call, "dtype"), module) == "bfloat16":
        return True
    return any(
        isinstance(arg, ast.Call) and dtype_of(keyword_arg(arg, "dtype"), module) == "bfloat16"
        for arg in call.args[:1]
    )


def _returned(module: ModuleFacts, func: ast.AST, depth: int) -> dict[int | None, str]:
    """The returned values a helper makes bfloat16 (the whole value, or tuple positions)."""
    key = ("bf16-returned", id(func), depth)
    cached = module.memo.get(key)
    if isinstance(cached, dict):
        return cached
    module.memo[key] = {}  # a recursive helper: nothing more
    bf16, fp32 = scope_dtypes(module, func, depth)
    found: dict[int | None, str] = {}

    def place(expr: ast.expr) -> str | None:
        name = dotted(expr)
        if name is not None and name in bf16 and name not in fp32:
            return f"bfloat16 in {_place(module, expr)} ({bf16[name][:40]})"
        if isinstance(expr, ast.Call):
            converted = conversion(expr, module)
            if converted is not None:
                return f"bfloat16 in {_place(module, expr)}" if converted[0] == "bfloat16" else None
            if isinstance(expr.func, ast.Attribute) and expr.func.attr in _SAME_MODULE:
                return place(expr.func.value)  # `return model.to(device)`: the same module
            if depth < _MAX_DEPTH:
                return _made_by(module, expr.func, depth).get(None)
        return None

    for node in module.scope_nodes.get(func, []):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        if isinstance(node.value, ast.Tuple):
            for index, element in enumerate(node.value.elts):
                evidence = place(element)
                if evidence is not None:
                    found.setdefault(index, evidence)
        else:
            evidence = place(node.value)
            if evidence is not None:
                found.setdefault(None, evidence)
    module.memo[key] = found
    return found


def _place(module: ModuleFacts, node: ast.AST) -> str:
    return f"{module.path.rsplit('/', 1)[-1]} line {getattr(node, 'lineno', 0)}"
