"""``GT005`` on one path: ``set_epoch`` called under a flag narrower than the one the sampler
is built under.

``loader = get_loader(..., distributed=distributed or ddp)`` builds a shuffling
``DistributedSampler`` when either flag is set; ``if ddp: loader.sampler.set_epoch(epoch)``
in the epoch loop reseeds it on the ``ddp`` path only, so the ``distributed`` path draws the
same order every epoch. Read: every ``set_epoch`` of the loop sits under a test of one name;
the loader's builder (a project function that builds a shuffling distributed sampler, or
``DistributedSampler`` itself) is given an ``or`` of that name and others, or the file builds
a shuffling distributed sampler where that name is false (the ``else:`` of ``if flag:``, the
body of ``if not flag:``): a flag-conditional ``set_epoch`` is read as skipped on the path
where its flag is false, and reported when a sampler exists on that path.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("s = DistributedSampler(d) if a or b else None\\n"
    ...        "for epoch in range(3):\\n    if b:\\n        s.set_epoch(epoch)\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> [loop.lineno for loop in reseeded_on_one_path(facts)]
    [2]
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import call_arg, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted

__all__ = ["reseeded_on_one_path"]


def reseeded_on_one_path(facts: ModuleFacts) -> list[ast.stmt]:
    """The loops of a file whose every ``set_epoch`` is guarded by a flag narrower than the
    condition the sampler is built under (see the module docstring)."""
    found: list[ast.stmt] = []
    for loop in facts.nodes:
        if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
            continue
        scope = facts.scope_containing(loop)
        guarded = _guarded_set_epochs(loop)
        if not guarded:
            continue
        flags = {flag for flag, _ in guarded}
        flag = flags.pop() if len(flags) == 1 else None
        if flag is None:
            continue  # a set_epoch with no guard, or guards that differ
        for _, call in guarded:
            root = call.func.value if isinstance(call.func, ast.Attribute) else None
            while isinstance(root, ast.Attribute):  # `loader.sampler.set_epoch`
                root = root.value
            if not isinstance(root, ast.Name):
                continue
            values = facts.lookup(root.id, scope, (call.lineno, call.col_offset))
            if any(v is not None and _built_wider(v, flag, facts) for v in values):
                found.append(loop)
                break
        else:
            if _built_where_false(facts, flag):
                found.append(loop)
    return found


def _built_where_false(facts: ModuleFacts, flag: str) -> bool:
    """A shuffling distributed sampler of the file is built where ``flag`` is false: in the
    ``else:`` of ``if flag:`` (both sides build one, the other side's ``num_replicas`` given by
    hand) or under ``if not flag:``. The epoch loop's ``if flag: set_epoch(epoch)`` then skips
    a sampler that exists, and that path repeats one order every epoch."""
    flag = flag.removeprefix("self.")  # `self.cfg.ddp` in a method, `cfg.ddp` in __init__
    for node in facts.nodes:
        if not isinstance(node, ast.If):
            continue
        test = node.test
        if (dotted(test) or "").removeprefix("self.") == flag:
            where = node.orelse
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            negated = (dotted(test.operand) or "").removeprefix("self.")
            where = node.body if negated == flag else []
        else:
            continue
        for stmt in where:
            for call in ast.walk(stmt):
                if isinstance(call, ast.Call) and _builds_shuffling(call, facts):
                    return True
    return False


def _builds_shuffling(call: ast.Call, facts: ModuleFacts) -> bool:
    if tail(call_name(call, facts.imports)) == "DistributedSampler":
        shuffle = call_arg(call, 3, "shuffle")
        return not (isinstance(shuffle, ast.Constant) and shuffle.value is False)
    return any(s.shuffles_sampler for s in facts.summaries(call))


def _guarded_set_epochs(loop: ast.stmt) -> list[tuple[str | None, ast.Call]]:
    """Each ``set_epoch`` call of the loop (not of a loop inside it) with the name its
    enclosing ``if`` tests (None: none, or a test that is not one name)."""
    found: list[tuple[str | None, ast.Call]] = []

    def visit(stmts: list[ast.stmt], flag: str | None) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                visit(stmt.body, dotted(stmt.test) if flag is None else flag)
                visit(stmt.orelse, None if flag is None else flag)
                continue
            if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                continue  # an inner loop's set_epoch is that loop's
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call) and tail(dotted(node.func)) == "set_epoch":
                    found.append((flag, node))

    visit(getattr(loop, "body", []), None)
    return found


def _built_wider(value: ast.expr, flag: str, facts: ModuleFacts) -> bool:
    """A sampler (or a loader) built under an ``or`` of ``flag`` and other names."""
    if isinstance(value, ast.IfExp):
        return _wider(value.test, flag) and _builds_sampler(value.body, facts)
    return (
        isinstance(value, ast.Call)
        and _builds_sampler(value, facts)
        and any(_wider(arg, flag) for arg in [*value.args, *(k.value for k in value.keywords)])
    )


def _wider(test: ast.expr, flag: str) -> bool:
    if not isinstance(test, ast.BoolOp) or not isinstance(test.op, ast.Or):
        return False
    names = [dotted(v) for v in test.values]
    return flag in names and any(n != flag for n in names)


def _builds_sampler(value: ast.expr, facts: ModuleFacts) -> bool:
    if not isinstance(value, ast.Call):
        return False
    if tail(call_name(value, facts.imports)) == "DistributedSampler":
        return True
    return any(s.shuffles_sampler for s in facts.summaries(value))


def constant_epochs(facts: ModuleFacts) -> list[ast.Call]:
    """``GT005``: ``set_epoch(x)`` inside a ``for`` loop where ``x`` is the same every pass:
    a literal, or a name (``args.epochs``) that nothing in the enclosing function rebinds
    and whose root is neither the loop's target nor ``self`` (a method may advance
    ``self.epoch``). The sampler is reseeded with the same seed each epoch, as if never set."""
    found: list[ast.Call] = []
    if not any(tail(dotted(c.func)) == "set_epoch" for c in facts.calls):
        return found  # most modules: nothing below can match
    for func in [facts.tree, *facts.nodes]:
        if not isinstance(func, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        stored = {
            dotted(n) for n in ast.walk(func) if isinstance(getattr(n, "ctx", None), ast.Store)
        }
        for loop in ast.walk(func):
            if not isinstance(loop, ast.For) or not isinstance(loop.target, ast.Name):
                continue
            for call in _loop_calls(loop):
                if tail(dotted(call.func)) != "set_epoch" or len(call.args) != 1:
                    continue
                arg = call.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, int):
                    found.append(call)
                    continue
                key = dotted(arg) if isinstance(arg, ast.Attribute) else None  # a bare name
                root = key.split(".")[0] if key else None  # may be a parameter: the epoch
                if key is None or root in (loop.target.id, "self", "cls"):
                    continue
                if not any(
                    s is not None and (s == root or s.startswith(f"{root}.")) for s in stored
                ):
                    found.append(call)
    return list(dict.fromkeys(found))


def _loop_calls(loop: ast.For) -> list[ast.Call]:
    """The calls in the loop's body outside nested functions and classes."""
    out: list[ast.Call] = []
    todo: list[ast.AST] = list(loop.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out
