"""Whether a value saved or read for its ``state_dict()`` is the DDP wrapper (``GT006``).

By its last binding, or by any binding of the function when the name is wrapped on one path
(``if args.distributed: model = DDP(model)``) and not unwrapped (``model = model.module``)
before the use, or unpacked from a function of the module that returns the wrapper at that
position (``model, optimizer = create_model()``), or a library's wrapper
(``deepspeed.initialize``).

A name bound on both sides of one ``if`` is read branch by branch: in

    if distributed:
        model = DDP(model)
        base_model = model.module
    else:
        base_model = model

``base_model`` is never the wrapper: the ``else`` runs only when the ``if`` body, the one
place ``model`` is wrapped, did not. The same holds across two ``if``s on one unchanged test:
``if args.distributed: model = DDP(model)``, later ``if args.distributed: ... else:
torch.save(model.state_dict(), path)`` saves the plain model, and so it does when the
wrapping test only adds a condition (``if torch.cuda.device_count() > 1 and cfg.DIST_TRAIN:``
wraps, ``if cfg.DIST_TRAIN: ... else: torch.save(model.state_dict(), path)`` saves).

Example:
    >>> src = ("def f(distributed, model):\\n"
    ...        "    if distributed:\\n"
    ...        "        model = DDP(model)\\n"
    ...        "        base = model.module\\n"
    ...        "    else:\\n"
    ...        "        base = model\\n"
    ...        "    return base\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> func = facts.tree.body[0]
    >>> is_ddp_wrapper(facts, func.body[1].value, facts.scope_of(func))
    False
"""

from __future__ import annotations

import ast
import copy

from gpu_training.diagnostics.lint.calls import node_end, node_start, parameter_index, parents
from gpu_training.diagnostics.lint.collectives import UNDECIDED, bound_constants, literal
from gpu_training.diagnostics.lint.implied import contradict, known, unchanged
from gpu_training.diagnostics.lint.library_wrappers import library_wrapper
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.returned_state import unpacked_from_local_call
from gpu_training.diagnostics.lint.state_saves import passed_at, saved_state_parameters
from gpu_training.diagnostics.lint.summary import FuncRef

__all__ = ["is_ddp_wrapper", "saved_where_unwrapped"]

_WRAPPER_KINDS = frozenset({"ddp", "dp"})


def is_ddp_wrapper(facts: ModuleFacts, expr: ast.expr, scope: Scope, depth: int = 0) -> bool:
    """Whether ``expr`` is the DDP (or DataParallel) wrapper where it is read.

    Args:
        facts: The module's facts.
        expr: The value (``model`` of ``model.state_dict()``, or an argument handed to a
            saving helper).
        scope: The function it is read in.
        depth: Unpacked calls followed so far.
    """
    if _wrapped_on_other_side(facts, expr, scope):
        return False
    if facts.kinds(expr, scope) & _WRAPPER_KINDS and not _unwrapped_by_branch(facts, expr, scope):
        return True
    if library_wrapper(facts, expr, scope) is not None:  # deepspeed.initialize()
        return True
    key = dotted(expr)
    if key is None or not isinstance(expr, ast.Name):
        return False
    every = facts.lookup(key, scope, node_start(expr))
    if every == [None] and depth < 3:
        made = unpacked_from_local_call(facts, expr.id, scope)
        return any(is_ddp_wrapper(facts, item, inner, depth + 1) for item, inner in made)
    last = [v for v in every if v is not None]
    if any(isinstance(v, ast.Attribute) and v.attr == "module" for v in last):
        return False
    if _unwrapped_by_branch(facts, expr, scope):
        return False
    return any(
        v is not None and facts.kinds(v, scope) & _WRAPPER_KINDS
        for v in _reaching(facts, expr, scope)
    )


def _reaching(facts: ModuleFacts, name: ast.Name, scope: Scope) -> list[ast.expr | None]:
    """Every value the function binds to ``name`` (any branch), less those bound after the
    read with no loop around both: ``torch.save(model.state_dict(), p)`` and only then
    ``model = DDP(model)`` saves the plain model. A name the function does not bind itself
    keeps every binding (another call may have run them)."""
    entries = scope.bindings.get(name.id)
    if not entries:
        return facts.lookup_all(name.id, scope)
    read = node_start(name)
    held = parents(facts)
    loops = []
    node: ast.AST | None = held.get(id(name))
    while node is not None and node is not scope.node:
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            loops.append(node)
        node = held.get(id(node))
    return [
        value
        for at, value in entries
        if at <= read or any(node_start(loop) <= at <= node_end(loop) for loop in loops)
    ]


def _unwrapped_by_branch(facts: ModuleFacts, expr: ast.expr, scope: Scope) -> bool:
    """A name every binding of which in the function is ``x.module`` or, in the other branch
    of an ``if`` from every wrapping of ``x``, the plain ``x`` (see the module's example)."""
    if not isinstance(expr, ast.Name):
        return False
    assigns = _assignments(facts, scope, expr.id)
    if not assigns:
        return False
    for stmt in assigns:
        value = stmt.value
        if isinstance(value, ast.Attribute) and value.attr == "module":
            continue
        if not isinstance(value, ast.Name):
            return False
        wrappings = [
            a
            for a in _assignments(facts, scope, value.id)
            if facts.kinds(a.value, scope) & _WRAPPER_KINDS
        ]
        if not wrappings or not all(_exclusive(facts, scope, w, stmt) for w in wrappings):
            return False
    return True


def _assignments(facts: ModuleFacts, scope: Scope, name: str) -> list[ast.Assign]:
    """The plain assignments ``name = value`` of the function."""
    return [
        node
        for node in facts.scope_nodes.get(scope.node, [])
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == name
    ]


def _exclusive(facts: ModuleFacts, scope: Scope, first: ast.stmt, second: ast.stmt) -> bool:
    """The two statements sit in the two branches of one ``if`` (never both in a pass)."""
    for node in facts.scope_nodes.get(scope.node, []):
        if not isinstance(node, ast.If) or not node.orelse:
            continue
        body = {id(n) for s in node.body for n in ast.walk(s)}
        orelse = {id(n) for s in node.orelse for n in ast.walk(s)}
        if (id(first) in body and id(second) in orelse) or (
            id(first) in orelse and id(second) in body
        ):
            return True
    return False


def _branch_sides(facts: ModuleFacts, scope: Scope, target: ast.AST) -> list[tuple[ast.If, bool]]:
    """``(if, in_body)`` for every ``if`` of the function holding ``target`` in a branch."""
    sides = []
    for node in facts.scope_nodes.get(scope.node, []):
        if not isinstance(node, ast.If):
            continue
        for in_body, block in ((True, node.body), (False, node.orelse)):
            if any(target is n for stmt in block for n in ast.walk(stmt)):
                sides.append((node, in_body))
    return sides


def _wrapped_on_other_side(facts: ModuleFacts, expr: ast.expr, scope: Scope) -> bool:
    """A name every wrapping of which sits in one branch of an ``if`` on a test that the use
    sits on the other branch of (the same ``if``, or a later one on the same unchanged test)."""
    if not isinstance(expr, ast.Name):
        return False
    wrappings = _wrappings(facts, scope, expr.id)
    if not wrappings:
        return False
    uses = _branch_sides(facts, scope, expr)
    for wrap in wrappings:
        if not any(
            contradict(known(first.test, first_in_body), known(second.test, second_in_body))
            and (
                first is second or unchanged(facts, scope, first.test, first.lineno, second.lineno)
            )
            for first, first_in_body in _branch_sides(facts, scope, wrap)
            for second, second_in_body in uses
            if first.lineno <= second.lineno
        ):
            return False
    return True


def saved_where_unwrapped(
    facts: ModuleFacts, scope: Scope, call: ast.Call, ref: FuncRef, position: int, given: ast.expr
) -> bool:
    """Whether a helper saves its parameter's ``state_dict()`` only where the caller's wrapper
    was not made: the caller wraps under a test, the helper saves on the other side of it.

        if torch.cuda.device_count() > 1 and cfg.MODEL.DIST_TRAIN:   # the caller
            model = DDP(model)
        do_train(cfg, model)
        ...
        def do_train(cfg, model):                                    # the helper
            if cfg.MODEL.DIST_TRAIN:
                if dist.get_rank() == 0:
                    torch.save(model.module.state_dict(), path)
            else:
                torch.save(model.state_dict(), path)                 # the plain model

    The helper's tests are read through what the call passes (``cfg`` for ``cfg``); a test that
    reads anything but the parameters, or a parameter assigned before the save, says nothing.
    A save under a test the call's literals decide against it (``if is_fsdp:`` with
    ``is_fsdp`` left at its default ``False``) never runs for that call.

    Args:
        facts: The caller's module.
        scope: The caller's function (or module).
        call: The call of the helper.
        ref: The helper.
        position: The parameter whose ``state_dict()`` the helper saves.
        given: What the call passes there.
    """
    owner, func = ref
    if not isinstance(given, ast.Name):
        return False
    wraps = _wrappings(facts, scope, given.id)
    inner = owner.scope_of(func)
    saves = [
        node
        for node in owner.scope_nodes.get(func, [])
        if isinstance(node, ast.Call)
        and call_name(node, owner.imports) == "torch.save"
        and position in saved_state_parameters(owner, node, inner)
    ]
    if not wraps or not saves or any(w.lineno > call.lineno for w in wraps):
        return False
    names = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    indices = {name: parameter_index(func, name) for name in names}
    passed = {name: passed_at(call, func, i) for name, i in indices.items() if i >= 0}
    bound = bound_constants(func, call)  # `is_fsdp` left at its default False
    for save in saves:
        sides = _branch_sides(owner, inner, save)
        if any(_decided(test.test, bound) not in (None, holds) for test, holds in sides):
            continue  # a branch this call never takes (`if is_fsdp:` with is_fsdp=False)
        said: frozenset[tuple[str, bool]] = frozenset()
        for test, holds in sides:
            seen = _through(test.test, passed)
            if seen is not None and unchanged(owner, inner, test.test, func.lineno, save.lineno):
                said |= known(seen, holds)
        for wrap in wraps:
            before = frozenset().union(
                *(
                    known(test.test, holds)
                    for test, holds in _branch_sides(facts, scope, wrap)
                    if unchanged(facts, scope, test.test, test.lineno, call.lineno)
                )
            )
            if not contradict(before, said):
                return False
    return True


def _decided(test: ast.expr, bound: dict[str, object]) -> bool | None:
    """The truth of a helper's test over the literals a call binds (None: undecided)."""
    value = literal(test, bound)
    return None if value is UNDECIDED else bool(value)


def _wrappings(facts: ModuleFacts, scope: Scope, name: str) -> list[ast.Assign]:
    """The assignments of the function that bind ``name`` to a DDP or DataParallel wrapper."""
    return [
        a for a in _assignments(facts, scope, name) if facts.kinds(a.value, scope) & _WRAPPER_KINDS
    ]


def _through(test: ast.expr, passed: dict[str, ast.expr | None]) -> ast.expr | None:
    """The helper's ``test`` as the caller writes it (each parameter replaced by what the call
    passes), or None when it reads a name that is not a parameter passed by the call."""
    names = [n for n in ast.walk(test) if isinstance(n, ast.Name)]
    if not names or any(passed.get(n.id) is None for n in names):
        return None

    class _Swap(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:
            value = passed[node.id]
            assert value is not None
            return copy.deepcopy(value)

    return _Swap().visit(copy.deepcopy(test))
