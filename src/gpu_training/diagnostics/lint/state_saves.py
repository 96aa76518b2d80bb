"""Which ``state_dict()`` a save writes: for ``GT006`` through a helper of the project.

``GT006`` reports the DDP wrapper's ``state_dict()`` saved with ``module.`` key prefixes.
The save is often one hop away: ``save_model(net, optimizer, epoch, path)`` builds
``{"model": net.state_dict(), ...}`` and calls ``torch.save``. A helper's summary records
the parameter whose ``state_dict()`` reaches ``torch.save`` (in the saved expression, or
through local names bound to it: ``sd = net.state_dict(); state = {"model": sd}``), and the
caller reports the call that hands it the wrapper. The branch of ``m.module.state_dict() if
hasattr(m, "module") else m.state_dict()`` that runs without ``.module`` does not count, nor
the plain branch of ``m.module.state_dict() if cfg["DDP"] else m.state_dict()``: the script's
own test, whatever it reads, picks the branch that unwraps ``m`` when it is wrapped.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("def save_model(net, opt, path):\\n    sd = net.state_dict()\\n"
    ...        "    torch.save({'model': sd, 'opt': opt.state_dict()}, path)\\n")
    >>> tree = ast.parse(src)
    >>> facts = ModuleFacts(tree)
    >>> func = tree.body[0]
    >>> saved_state_parameters(facts, func.body[1].value, facts.scope_of(func))
    (0, 1)
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator

from gpu_training.diagnostics.lint.calls import call_arg, node_start, parents, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted

__all__ = [
    "passed_at",
    "saved_state_parameters",
    "state_dict_calls",
    "unwrapped_branches",
    "unwrapped_here",
]

_WRAPPERS = frozenset(
    {"DistributedDataParallel", "DDP", "DataParallel", "FullyShardedDataParallel", "FSDP"}
)

_MAX_HOPS = 3  # local names followed from the saved expression


def saved_state_parameters(facts: ModuleFacts, save: ast.Call, scope: Scope) -> tuple[int, ...]:
    """The positions of the parameters whose ``state_dict()`` a ``torch.save`` writes.

    Args:
        facts: The module's facts.
        save: The ``torch.save(...)`` call.
        scope: The function it is in.

    Returns:
        The parameters' positions (``self``/``cls`` not counted), in order; empty when no
        parameter's ``state_dict()`` reaches the save, or the scope is not a function.
    """
    func = scope.node
    obj = call_arg(save, 0, "obj")
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or obj is None:
        return ()
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    skip = 1 if params and params[0] in ("self", "cls") else 0
    exprs: list[ast.AST] = [obj]
    seen: set[int] = set()
    for _ in range(_MAX_HOPS):  # state = {"model": sd}; sd = net.state_dict()
        names = [
            n
            for e in exprs
            for n in ast.walk(e)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in seen
        ]
        seen |= {id(n) for n in names}
        for name in names:
            if name.id not in params:
                exprs += [v for v in facts.lookup(name.id, scope, node_start(name)) if v]
    found: set[int] = set()
    plain = unwrapped_branches(func)  # `if hasattr(net, "module"): ... else: sd = net.state_dict()`
    for call in state_dict_calls(exprs):
        if id(call) in plain:
            continue
        owner = call.func.value  # type: ignore[attr-defined]
        if isinstance(owner, ast.Name) and owner.id in params[skip:]:
            found.add(params.index(owner.id) - skip)
    return tuple(sorted(found))


def passed_at(
    call: ast.Call, func: ast.FunctionDef | ast.AsyncFunctionDef, position: int
) -> ast.expr | None:
    """What ``call`` gives ``func``'s parameter at ``position`` (``self``/``cls`` not counted):
    positionally, or by the parameter's name (``logger.save_checkpoint(model=self.model)``)."""
    if position < len(call.args):
        arg = call.args[position]
        return None if any(isinstance(a, ast.Starred) for a in call.args[: position + 1]) else arg
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    skip = 1 if params and params[0] in ("self", "cls") else 0
    if position + skip >= len(params) or position + skip < len(func.args.posonlyargs):
        return None
    name = params[position + skip]
    return next((k.value for k in call.keywords if k.arg == name), None)


def state_dict_calls(exprs: Iterable[ast.AST]) -> Iterator[ast.Call]:
    """The ``x.state_dict()`` calls in ``exprs``, less those in an unwrapped branch
    (:func:`unwrapped_branches`): the ones whose ``x`` may be a wrapper."""
    for expr in exprs:
        unwrapped = unwrapped_branches(expr)
        for node in ast.walk(expr):
            if (
                id(node) not in unwrapped
                and isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "state_dict"
            ):
                yield node


def unwrapped_branches(expr: ast.AST) -> set[int]:
    """The nodes of the branch of ``m.module.state_dict() if hasattr(m, "module") else
    m.state_dict()`` that runs only when ``m`` has no ``.module``: not a wrapper there. The
    same for the statement (``if hasattr(m, "module"): sd = m.module.state_dict()`` /
    ``else: sd = m.state_dict()``) in a helper's body; mirrored branches under another test
    (``... if cfg["DDP"] else ...``) count in the expression only."""
    found: set[int] = set()
    for node in ast.walk(expr):
        if not isinstance(node, (ast.IfExp, ast.If)):
            continue
        body: list[ast.AST] = [*node.body] if isinstance(node, ast.If) else [node.body]
        orelse: list[ast.AST] = [*node.orelse] if isinstance(node, ast.If) else [node.orelse]
        says = _says_wrapped(node.test, None)
        if says is not None:
            found |= {id(n) for part in (orelse if says else body) for n in ast.walk(part)}
        if isinstance(node, ast.If):
            continue  # a statement's branches are weighed by the checks' own guard reading
        for wrapped, plain in ((body, orelse), (orelse, body)):
            if _unwraps(wrapped) & _state_owners(plain):
                found |= {id(n) for part in plain for n in ast.walk(part)}
    return found


def _unwraps(nodes: list[ast.AST]) -> set[str]:
    """``m`` for each ``m.module.state_dict()`` in ``nodes``."""
    return {
        owner
        for call in state_dict_calls(nodes)
        if isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Attribute)
        and call.func.value.attr == "module"
        and (owner := dotted(call.func.value.value)) is not None
    }


def _state_owners(nodes: list[ast.AST]) -> set[str]:
    """``m`` for each ``m.state_dict()`` in ``nodes``."""
    return {
        owner
        for call in state_dict_calls(nodes)
        if isinstance(call.func, ast.Attribute) and (owner := dotted(call.func.value)) is not None
    }


def unwrapped_here(facts: ModuleFacts, node: ast.AST, owner: ast.expr) -> bool:
    """Whether ``node`` (a ``state_dict()`` call bound to a name and saved later) runs only on
    the side of a test where ``owner`` is not wrapped: the ``else`` of ``if hasattr(model,
    "module"):`` or ``if isinstance(model, DistributedDataParallel):``, the body of ``if not
    hasattr(model, "module"):``, the same sides of a conditional expression. There ``model``
    is the plain model, its keys have no ``module.``.

    Example:
        >>> from gpu_training.diagnostics.lint.model import ModuleFacts
        >>> src = ("if hasattr(m, 'module'):\\n    s = m.module.state_dict()\\n"
        ...        "else:\\n    s = m.state_dict()\\n")
        >>> facts = ModuleFacts(ast.parse(src))
        >>> call = facts.tree.body[0].orelse[0].value
        >>> unwrapped_here(facts, call, call.func.value)
        True
    """
    name = dotted(owner)
    if name is None:
        return False
    up = parents(facts)
    child, parent = node, up.get(id(node))
    while parent is not None and not isinstance(
        parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    ):
        if isinstance(parent, (ast.If, ast.IfExp)):
            wrapped = _says_wrapped(parent.test, name)
            side = parent.orelse if wrapped else parent.body
            if wrapped is not None and any(child is c for c in _as_list(side)):
                return True
        child, parent = parent, up.get(id(parent))
    return False


def _as_list(side: ast.AST | list[ast.stmt]) -> list[ast.AST]:
    return list(side) if isinstance(side, list) else [side]


def _says_wrapped(test: ast.expr, name: str | None) -> bool | None:
    """True: the test holds where the model is wrapped (``hasattr(m, "module")``,
    ``isinstance(m, DDP)``); False: where it is not (``not ...``); None: neither. ``name``
    is the model's (None: any)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _says_wrapped(test.operand, name)
        return None if inner is None else not inner
    if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and len(test.args) == 2):
        return None
    subject, what = test.args
    if name is not None and dotted(subject) != name:
        return None
    if test.func.id == "hasattr":
        return True if isinstance(what, ast.Constant) and what.value == "module" else None
    if test.func.id == "isinstance":
        kinds = what.elts if isinstance(what, ast.Tuple) else [what]
        return True if any(tail(dotted(k)) in _WRAPPERS for k in kinds) else None
    return None
