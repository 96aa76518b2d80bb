"""``GT009``: a collective under a test of a value each rank computed from its own shard.

A rank test is not the only way to split the ranks. A validation metric summed over a sharded
loader (``DistributedSampler``, ``fabric.setup_dataloaders``, ``accelerator.prepare``) and
never reduced differs from rank to rank, so::

    for x, y in val_loader:            # this rank's shard
        psnr += metric(model(x), y)
    if psnr > best:                    # true on some ranks only
        fabric.save(path, state)       # a barrier: the others never arrive

hangs as surely as a collective under ``if rank == 0:``. The value is followed in the
function that tests it: assigned or accumulated inside a ``for`` over a sharded loader, or
returned by a function of the file that loops over the sharded loader it is handed; a
value passed to a collective in that function (``all_reduce(psnr)``, ``fabric.all_reduce``)
counts as reduced, as does one that comes out of a collective.

Example:
    >>> from gpu_training.diagnostics.lint import lint_source
    >>> source = '''
    ... import lightning as L
    ... def fit(model, val_loader, best):
    ...     fabric = L.Fabric(devices=4)
    ...     fabric.launch()
    ...     val_loader = fabric.setup_dataloaders(val_loader)
    ...     score = 0.0
    ...     for x, y in val_loader:
    ...         score += float((model(x) == y).float().mean())
    ...     if score > best:
    ...         fabric.save("best.ckpt", {"model": model})
    ... '''
    >>> [(f.code, f.line) for f in lint_source(source) if f.code == "GT009"]
    [('GT009', 11)]
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from gpu_training.diagnostics.lint.calls import call_arg, parameter_index, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted

__all__ = ["locally_decided_collectives"]

_SHARDING_CALLS = frozenset({"setup_dataloaders", "prepare", "prepare_data_loader"})
_LOOP_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip", "islice", "list"})
_Body = ast.FunctionDef | ast.AsyncFunctionDef | ast.Module
_Collective = Callable[[ast.Call, Scope], "str | None"]


def locally_decided_collectives(
    facts: ModuleFacts, collective: _Collective
) -> list[tuple[ast.Call, str]]:
    """The collectives that run under an ``if`` testing a rank-local value.

    Args:
        facts: The module's facts.
        collective: What collective a call runs (``RankAnalysis.collective``), or None.

    Returns:
        ``(call, detail)`` for each such collective.
    """
    found: list[tuple[ast.Call, str]] = []
    seen: set[int] = set()
    for node, scope in facts.scopes.items():
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            continue  # a script's `if __name__ == "__main__":` body is the module's
        body_facts = _BodyFacts(facts, node, scope, collective)
        if not body_facts.collectives:
            continue  # no collective anywhere in the body: none under any of its tests
        for test, body in _ifs(node.body):
            local = body_facts.local_value(test)
            if local is None:
                continue
            for call in _calls(body):
                name = body_facts.collectives.get(id(call))
                if name is not None and id(call) not in seen:
                    seen.add(id(call))
                    text = ast.unparse(test)
                    found.append(
                        (call, f"{name} under `if {text}`: {local}, never reduced, so ranks differ")
                    )
    return found


def _ifs(stmts: list[ast.stmt]) -> Iterator[tuple[ast.expr, list[ast.stmt]]]:
    """Every ``if`` of a function body (not of nested functions), with its two branches."""
    for stmt in stmts:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, ast.If):
            yield stmt.test, [*stmt.body, *stmt.orelse]
        for field in ("body", "orelse", "finalbody"):
            yield from _ifs(getattr(stmt, field, []))
        for handler in getattr(stmt, "handlers", []):
            yield from _ifs(handler.body)


def _calls(stmts: list[ast.stmt]) -> Iterator[ast.Call]:
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                yield node


class _BodyFacts:
    """What the tests of one function (or module) body are read against, each part built
    once on first use: a body has many ``if``s, and each asks the same questions of it."""

    def __init__(self, facts: ModuleFacts, func: _Body, scope: Scope, collective: _Collective):
        self.facts = facts
        self.func = func
        self.scope = scope
        self.collective = collective
        self._reduced: set[str] | None = None
        self._why: dict[str, str | None] = {}
        self._nodes: list[ast.AST] | None = None
        self._loops: list[tuple[ast.For | ast.AsyncFor, ast.Name]] | None = None
        self._collectives: dict[int, str] | None = None
        self._collective_calls: list[ast.Call] = []

    def local_value(self, test: ast.expr) -> str | None:
        """Why the test reads a rank-local value (None: it does not, as far as shown)."""
        names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
        if not names:
            return None
        for name in sorted(names - self.reduced):
            if name not in self._why:
                self._why[name] = self._assigned_locally(name)
            why = self._why[name]
            if why is not None:
                return f"{name} is {why}"
        return None

    @property
    def reduced(self) -> set[str]:
        """The names read by a collective's call in this body (their values are reduced)."""
        if self._reduced is None:
            self.collectives  # noqa: B018 - fills _collective_calls on first use
            self._reduced = {
                a.id
                for call in self._collective_calls
                for a in ast.walk(call)
                if isinstance(a, ast.Name)
            }
        return self._reduced

    @property
    def collectives(self) -> dict[int, str]:
        """The collective each call of the body runs, by the call's ``id``."""
        if self._collectives is None:
            self._collectives = {}
            for call in _calls(self.func.body):
                name = self.collective(call, self.scope)
                if name is not None:
                    self._collectives[id(call)] = name
                    self._collective_calls.append(call)
        return self._collectives

    @property
    def nodes(self) -> list[ast.AST]:
        """Every node of the body, nested functions included (as ``ast.walk`` yields them)."""
        if self._nodes is None:
            self._nodes = list(ast.walk(self.func))
        return self._nodes

    @property
    def sharded_loops(self) -> list[tuple[ast.For | ast.AsyncFor, ast.Name]]:
        """The body's ``for`` loops over a sharded loader, with the loader's name."""
        if self._loops is None:
            self._loops = []
            for loop in self.nodes:
                if not isinstance(loop, (ast.For, ast.AsyncFor)):
                    continue
                source = _loop_source(loop.iter)
                if source is not None and _sharded(self.facts, source, self.scope):
                    self._loops.append((loop, source))
        return self._loops

    def _assigned_locally(self, name: str) -> str | None:
        facts, scope = self.facts, self.scope
        for loop, source in self.sharded_loops:
            for node in ast.walk(loop):
                if (
                    isinstance(node, ast.AugAssign)
                    and dotted(node.target) == name
                    and _reads_data(node.value)
                ):
                    return f"summed over this rank's shard of {source.id}"
        for node in self.nodes:
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
                continue
            if not any(dotted(t) == name for t in node.targets):
                continue
            call = node.value
            if self.collective(call, scope) is not None:
                continue
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                if isinstance(arg, ast.Name) and _sharded(facts, arg, scope):
                    for callee in facts.local_functions(call):
                        if _loops_over_parameter(callee, call, arg.id, self.collective, facts):
                            return f"{callee.name}() over this rank's shard of {arg.id}"
        return None


def _reads_data(value: ast.expr) -> bool:
    """An accumulated term that depends on the batch (``+= metric(out, y)``), not a count
    (``+= 1``, ``+= len(batch)``: the same on every rank of an evenly sharded loader)."""
    if isinstance(value, ast.Constant):
        return False
    if isinstance(value, ast.Call) and tail(dotted(value.func)) == "len":
        return False
    return any(isinstance(n, (ast.Call, ast.Subscript, ast.Attribute)) for n in ast.walk(value))


def _loops_over_parameter(
    callee: ast.FunctionDef | ast.AsyncFunctionDef,
    call: ast.Call,
    passed: str,
    collective: _Collective,
    facts: ModuleFacts,
) -> bool:
    """The function loops over the parameter the call binds ``passed`` to, and runs no
    collective (no reduction of what it computes)."""
    params = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]]
    bound: str | None = None
    for index, arg in enumerate(call.args):
        if isinstance(arg, ast.Name) and arg.id == passed and index < len(params):
            bound = params[index]
    for keyword in call.keywords:
        if isinstance(keyword.value, ast.Name) and keyword.value.id == passed:
            bound = keyword.arg
    if bound is None:
        return False
    inner = facts.scope_of(callee)
    if any(collective(c, inner) is not None for c in _calls(callee.body)):
        return False
    return any(
        isinstance(n, (ast.For, ast.AsyncFor))
        and (source := _loop_source(n.iter)) is not None
        and source.id == bound
        for n in ast.walk(callee)
    )


def _loop_source(expr: ast.expr) -> ast.Name | None:
    """The name a loop iterates, through ``enumerate``/``tqdm``/``zip(loader, ...)``."""
    while isinstance(expr, ast.Call) and expr.args and tail(dotted(expr.func)) in _LOOP_WRAPPERS:
        expr = expr.args[0]
    return expr if isinstance(expr, ast.Name) else None


def _sharded(facts: ModuleFacts, name: ast.Name, scope: Scope, depth: int = 0) -> bool:
    """A loader each rank draws its own part of: the result of ``setup_dataloaders`` /
    ``prepare``, a ``DataLoader`` given a distributed sampler, or a parameter that every
    call of the function in this file passes such a loader."""
    values = [v for v in facts.lookup_all(name.id, scope) if v is not None]
    values += _unpacked_from(facts, name.id, scope)  # `train, val = fabric.setup_dataloaders(..)`
    for value in values:
        if isinstance(value, ast.Call) and _shards(facts, value, scope):
            return True
    func = scope.node
    if values or depth > 2 or not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    if name.id not in params:
        return False
    index = parameter_index(func, name.id)
    passed = []
    for call, where in facts.calls_of(func):
        given = call_arg(call, index, name.id)
        passed.append(isinstance(given, ast.Name) and _sharded(facts, given, where, depth + 1))
    return bool(passed) and all(passed)


def _unpacked_from(facts: ModuleFacts, name: str, scope: Scope) -> list[ast.expr]:
    """The calls a name is unpacked from in its scope (``a, b = f(...)``)."""
    found: list[ast.expr] = []
    for node in facts.scope_nodes.get(scope.node, []):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for target in node.targets:
                if isinstance(target, (ast.Tuple, ast.List)) and any(
                    isinstance(e, ast.Name) and e.id == name for e in target.elts
                ):
                    found.append(node.value)
    return found


def _shards(facts: ModuleFacts, call: ast.Call, scope: Scope) -> bool:
    last = tail(dotted(call.func))
    if last in _SHARDING_CALLS:
        return True
    if last != "DataLoader":
        return False
    for keyword in call.keywords:
        if keyword.arg in ("sampler", "batch_sampler"):
            value = keyword.value
            if isinstance(value, ast.Name):
                bound = [v for v in facts.lookup_all(value.id, scope) if v is not None]
                value = bound[0] if len(bound) == 1 else value
            if isinstance(value, ast.Call) and "Distributed" in (tail(dotted(value.func)) or ""):
                return True
    return False
