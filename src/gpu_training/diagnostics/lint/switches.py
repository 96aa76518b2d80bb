"""Tests that tell one process from a process group, read from what their branches do.

Two shapes, beside the rank guards of :mod:`~gpu_training.diagnostics.lint.guards`:

* the world size compared with a number: ``world_size == 1`` / ``< 2`` hold in one process
  only (:data:`SINGLE`), ``world_size > 1`` / ``!= 1`` in every process of a group
  (:data:`MULTI`, whose ``else:`` is one process);
* a switch of the script's own, however it is spelled (``if args.ddp == True:``, ``if
  args.dist == "OFF":``, ``if use_ddp:``): its direction is what the branches of the file's
  tests of the same switch do. A value whose branch creates the process group (directly or
  through a function of the project) means a group; the other value of a two-valued switch
  means one process. Wrapping a model or building a sampler is not enough: ``if train:
  sampler = DistributedSampler(...)`` picks a loader, not a launch. A switch no branch of
  the file creates the group under is read as nothing. An ``if`` with no ``else`` whose body
  returns has the statements after it for its ``else`` (``if s == "single": return 0, 1``
  before ``init_process_group``); the final ``else:`` of an ``if``/``elif`` chain on one
  switch holds the values the chain did not test (:func:`_chain_else`).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("if args.dist == 'ON':\\n    dist.init_process_group()\\n"
    ...                  "if args.dist == 'OFF':\\n    pass\\n")
    >>> facts = ModuleFacts(tree)
    >>> switch_test(facts, tree.body[0].test), switch_test(facts, tree.body[1].test)
    ('multi', 'single')
"""

from __future__ import annotations

import ast
import bisect

from gpu_training.diagnostics.lint.calls import node_start, parents, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted

__all__ = ["MULTI", "SINGLE", "switch_test", "world_size_test"]

SINGLE = "single"
"""True on every rank or on none: only without a process group (``not dist.is_initialized()``)."""
MULTI = "multi"
"""True in every process of a group; its negation is :data:`SINGLE` (``world_size > 1``)."""

_GROUP_INITS = ("init_process_group", "init_distributed")
_EQ = (ast.Eq, ast.Is)
_NE = (ast.NotEq, ast.IsNot)
# `{switch: (values that set up a group, values that do not, every value tested)}`
_Index = dict[str, tuple[set[str], set[str], set[str]]]


def world_size_test(op: ast.cmpop, bound: object) -> str | None:
    """``world_size == 1`` / ``< 2`` hold in one process only (:data:`SINGLE`);
    ``world_size > 1`` / ``!= 1`` in every process of a group (:data:`MULTI`)."""
    if not isinstance(bound, int) or isinstance(bound, bool):
        return None
    compare = {
        ast.Eq: int.__eq__,
        ast.NotEq: int.__ne__,
        ast.Lt: int.__lt__,
        ast.LtE: int.__le__,
        ast.Gt: int.__gt__,
        ast.GtE: int.__ge__,
    }.get(type(op))
    if compare is None:
        return None
    one, many = compare(1, bound), compare(2, bound)
    return SINGLE if one and not many else MULTI if many and not one else None


def switch_test(facts: ModuleFacts, test: ast.expr) -> str | None:
    """Whether a switch of the script's own holds in one process (:data:`SINGLE`) or in
    every process of a group (:data:`MULTI`), by what the file's branches on it set up.

    Args:
        facts: The module's facts (with its project, if any).
        test: ``flag``, ``flag == literal`` or ``flag != literal`` (``is`` alike), where
            ``flag`` is a name or an attribute that is not a rank.

    Returns:
        :data:`SINGLE`, :data:`MULTI`, or None (not a switch the file's branches show).
    """
    read = _read(test)
    if read is None:
        return _chain_else(facts, test)
    key, value, positive = read
    found = _index(facts).get(key)
    if found is None:
        mirrored = _mirrors(facts).get((key, value))
        if mirrored is None:
            return None
        return mirrored if positive else (SINGLE if mirrored == MULTI else MULTI)
    group, alone, tested = found
    if value in group and value not in alone:
        equal = MULTI
    elif value in alone and value not in group:
        equal = SINGLE
    elif group and not alone and tested == group | {value}:
        equal = SINGLE  # the other value of a two-valued switch (`"OFF"` beside `"ON"`)
    else:
        return None
    return equal if positive else (SINGLE if equal == MULTI else MULTI)


def _rank_zero_test(facts: ModuleFacts, test: ast.expr) -> bool:
    """``rank == 0``, ``dist.get_rank() == 0``, ``args.local_rank in [-1, 0]``: a rank read
    (:meth:`ModuleFacts.mentions_rank`) compared with 0."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    left, right = test.left, test.comparators[0]
    if isinstance(left, ast.Constant):
        left, right = right, left
    if not facts.mentions_rank(left):
        return False
    if isinstance(test.ops[0], _EQ):
        return isinstance(right, ast.Constant) and right.value == 0
    if isinstance(test.ops[0], ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value == 0 for e in right.elts)
    return False


def _callees(stmts: list[ast.stmt]) -> set[str]:
    return {
        name
        for stmt in stmts
        for node in ast.walk(stmt)
        if isinstance(node, ast.Call) and (name := dotted(node.func)) is not None
    }


def _guarded_callees(facts: ModuleFacts, stmts: list[ast.stmt]) -> set[str]:
    """The calls made under a rank-0 test somewhere in ``stmts``."""
    found: set[str] = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.If) and _rank_zero_test(facts, node.test):
                found |= _callees(node.body)
    return found


def _mirrors(facts: ModuleFacts) -> dict[tuple[str, str], str]:
    """``{(switch, value): MULTI or SINGLE}`` from ``if``s whose two branches mirror each
    other around a rank guard, the layout of a script that runs alone or in a group:

        if cfg.MODEL.DIST_TRAIN:
            if dist.get_rank() == 0:
                torch.save(model.state_dict(), path)
        else:
            torch.save(model.state_dict(), path)

    The branch that calls ``torch.save`` on rank 0 only runs in a group; the one that calls it
    unguarded runs alone. Read where the file's own set-up calls say nothing of the switch (a
    trainer module handed the config of the script that creates the group)."""
    cached = facts.memo.get("switch-mirrors")
    if isinstance(cached, dict):
        return cached
    found: dict[tuple[str, str], str] = {}
    for node in facts.nodes:
        if not isinstance(node, ast.If) or not node.orelse:
            continue
        read = _read(node.test)
        if read is None or facts.mentions_rank(node.test):
            continue
        key, value, positive = read
        body, orelse = _guarded_callees(facts, node.body), _guarded_callees(facts, node.orelse)
        if body and not orelse and body & _callees(node.orelse):
            side = MULTI
        elif orelse and not body and orelse & _callees(node.body):
            side = SINGLE
        else:
            continue
        equal = side if positive else (SINGLE if side == MULTI else MULTI)
        if found.setdefault((key, value), equal) != equal:
            found[(key, value)] = ""  # the file's branches disagree: read as nothing
    result = {k: v for k, v in found.items() if v}
    facts.memo["switch-mirrors"] = result
    return result


def _chain_else(facts: ModuleFacts, test: ast.expr) -> str | None:
    """The ``else:`` of ``if s == "fsdp": ... elif s == "ddp": ... else:`` (walked as ``not
    (s == "ddp")``): the switch holds none of the chain's values, so one of the other values
    the file tests; one process when each of those sets up no group (``"single"``, where
    ``setup(s)`` returns before ``init_process_group``), a group when each sets one up."""
    if not (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)):
        return None
    _index(facts)
    chains = facts.memo.get("switch-chains")
    entry = chains.get(id(test.operand)) if isinstance(chains, dict) else None
    if entry is None:
        return None
    key, excluded = entry
    opaque = facts.memo.get("switch-opaque")
    if isinstance(opaque, frozenset) and key in opaque:
        return None  # `mode in ("fsdp", "hybrid")` elsewhere: values the chain cannot see
    group, alone, tested = _index(facts).get(key, (set(), set(), set()))
    rest = tested - excluded
    if rest and rest <= alone and not rest & group:
        return SINGLE
    if rest and rest <= group and not rest & alone:
        return MULTI
    return None


def _chains(facts: ModuleFacts) -> dict[int, tuple[str, frozenset[str]]]:
    """``id(test) -> (switch, values excluded when it fails)`` for each test of an
    ``if``/``elif`` chain of equality tests of one switch."""
    chains: dict[int, tuple[str, frozenset[str]]] = {}
    for node in facts.nodes:
        if not isinstance(node, ast.If) or id(node.test) in chains:
            continue
        current, key, excluded = node, None, frozenset[str]()
        while True:
            read = _read(current.test)
            if read is None or not read[2] or (key is not None and read[0] != key):
                break
            key, excluded = read[0], excluded | {read[1]}
            chains[id(current.test)] = (key, excluded)
            if not (len(current.orelse) == 1 and isinstance(current.orelse[0], ast.If)):
                break
            current = current.orelse[0]
    return chains


def _opaque(facts: ModuleFacts) -> frozenset[str]:
    """Switches also compared in a way :func:`_read` does not read (``in``, ``<``…): their
    values are not all known from the file's equality tests."""
    found: set[str] = set()
    for node in facts.nodes:
        if isinstance(node, ast.Compare) and (len(node.ops) != 1 or _read(node) is None):
            for side in (node.left, *node.comparators):
                key = dotted(side) if isinstance(side, (ast.Name, ast.Attribute)) else None
                if key is not None:
                    found.add(key)
    return frozenset(found)


def _rest_after(facts: ModuleFacts) -> dict[int, list[ast.stmt]]:
    """``id(if) -> the statements after it`` for an ``if`` with no ``else`` whose body always
    leaves (``if s == "single": return 0, 1``): they are its ``else``."""
    rest: dict[int, list[ast.stmt]] = {}
    for node in facts.nodes:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                leaves = isinstance(stmt, ast.If) and not stmt.orelse and stmt.body
                if leaves and isinstance(stmt.body[-1], (ast.Return, ast.Raise)):
                    rest[id(stmt)] = block[i + 1 :]
    return rest


def _read(test: ast.expr) -> tuple[str, str, bool] | None:
    """``(switch, value, positive)``: ``args.dist == "OFF"`` → ``("args.dist", "'OFF'",
    True)``; a bare ``flag`` reads as ``flag == True``, ``not flag`` as ``flag != True``."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _read(test.operand)
        return None if inner is None or inner[1] != "True" else (inner[0], "True", not inner[2])
    if isinstance(test, (ast.Name, ast.Attribute)):
        key = dotted(test)
        return None if key is None or key == "__name__" else (key, "True", True)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    op, left, right = test.ops[0], test.left, test.comparators[0]
    if isinstance(left, ast.Constant):
        left, right = right, left
    key = dotted(left) if isinstance(left, (ast.Name, ast.Attribute)) else None
    literal = isinstance(right, ast.Constant) and isinstance(right.value, (str, bool, int))
    if key is None or key == "__name__" or not literal or not isinstance(op, _EQ + _NE):
        return None
    assert isinstance(right, ast.Constant)
    return key, repr(right.value), isinstance(op, _EQ)


def _index(facts: ModuleFacts) -> _Index:
    """Every switch the module tests, with the values whose branch sets up distribution."""
    cached = facts.memo.get("switches")
    if isinstance(cached, dict):
        return cached
    facts.memo["switches"] = {}  # asked again while it is built (through a callee): nothing
    # one pass: the set-up calls by position, then each `if` looks its branches up by range
    calls = [c for c in facts.calls if _sets_up(facts, c)]
    setups = sorted(node_start(c) for c in calls)
    # a call of the project's that sets up the group only under `if flag:` does not on the
    # side where that flag is off (`if flag: mp.spawn(train, ...) else: train(0, 1, cfg)`)
    under = {node_start(c): _only_under(facts, c) for c in calls}
    index: _Index = {}
    rest = _rest_after(facts) if setups else {}
    for node in facts.nodes if setups else []:
        if not isinstance(node, ast.If):
            continue
        read = _read(node.test)
        if read is None:
            continue
        key, value, positive = read
        group, alone, tested = index.setdefault(key, (set(), set(), set()))
        tested.add(value)
        off = [at for at in setups if key not in under[at]] if value == "True" else setups
        body, orelse = (
            _holds(setups if positive else off, node.body),
            _holds(off if positive else setups, node.orelse or rest.get(id(node), [])),
        )
        if body != orelse:
            (group if body == positive else alone).add(value)
    facts.memo["switches"] = index
    facts.memo["switch-chains"] = _chains(facts) if setups else {}
    facts.memo["switch-opaque"] = _opaque(facts) if setups else frozenset()
    return index


def _sets_up(facts: ModuleFacts, call: ast.Call) -> bool:
    """The call creates the process group, itself or through functions of the project (read
    here, not through their summaries: a summary classifies guards, which read switches)."""
    if tail(call_name(call, facts.imports)) in _GROUP_INITS:
        return True
    return any(_function_creates(owner, func) for owner, func in facts.callees(call))


def _function_creates(facts: ModuleFacts, func: ast.AST) -> bool:
    key = ("creates-group", id(func))
    cached = facts.memo.get(key)
    if isinstance(cached, bool):
        return cached
    facts.memo[key] = False  # a function calling itself does not create a group by that
    found = any(
        isinstance(node, ast.Call) and _sets_up(facts, node)
        for node in facts.scope_nodes.get(func, [])
    )
    facts.memo[key] = found
    return found


def _only_under(facts: ModuleFacts, call: ast.Call) -> frozenset[str]:
    """The flags under every one of whose ``if flag:`` bodies each function ``call`` may run
    creates the group itself (``init_process_group`` in its own body); empty for a direct
    set-up call or one that creates the group any other way."""
    if tail(call_name(call, facts.imports)) in _GROUP_INITS:
        return frozenset()
    found: frozenset[str] | None = None
    for owner, func in facts.callees(call):
        for node in owner.scope_nodes.get(func, []):
            if not (isinstance(node, ast.Call) and _sets_up(owner, node)):
                continue
            if tail(call_name(node, owner.imports)) not in _GROUP_INITS:
                return frozenset()  # through another function: not read here
            flags = _enclosing_flags(owner, node, func)
            found = flags if found is None else found & flags
    return found or frozenset()


def _enclosing_flags(facts: ModuleFacts, node: ast.AST, func: ast.AST) -> frozenset[str]:
    """The bare flags (``if flag:``) whose bodies hold ``node`` inside ``func``."""
    held = parents(facts)
    flags: set[str] = set()
    child, parent = node, held.get(id(node))
    while parent is not None and parent is not func:
        if isinstance(parent, ast.If) and any(child is s for s in parent.body):
            read = _read(parent.test)
            if read is not None and read[1:] == ("True", True):
                flags.add(read[0])
        child, parent = parent, held.get(id(parent))
    return frozenset(flags)


def _holds(setups: list[tuple[int, int]], stmts: list[ast.stmt]) -> bool:
    """Whether a set-up call starts inside ``stmts`` (positions sorted: a binary search)."""
    if not stmts:
        return False
    first, last = stmts[0], stmts[-1]
    end = (getattr(last, "end_lineno", 0) or 0, getattr(last, "end_col_offset", 0) or 0)
    at = bisect.bisect_left(setups, node_start(first))
    return at < len(setups) and setups[at] <= end
