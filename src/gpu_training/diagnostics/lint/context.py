"""What the walk of :mod:`~gpu_training.diagnostics.lint.checks` knows at each statement.

:class:`Ctx` is the context carried down the statements — which ranks run this code (rank 0
only, the others, one rank, local rank 0 of each node), inside which loops and ``no_sync()``
blocks, whether the block ends the program — and the helpers here read a block or a test for
it: does the block always leave (:func:`terminates`), give up (:func:`ends_program`), which names
does a test require to be set (:func:`none_tested`)?

Example:
    >>> import ast
    >>> ends_program(ast.parse("print('bad input')\\nsys.exit(1)\\n").body)
    True
    >>> sorted(none_tested(ast.parse("writer is not None and step % 10 == 0", mode="eval").body))
    ['writer']
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import ModuleFacts, dotted

__all__ = [
    "ONE_PROCESS",
    "Ctx",
    "RawFinding",
    "ends_program",
    "entry_context",
    "names_node",
    "none_tested",
    "terminates",
]

_EXITS = frozenset({"exit", "_exit", "abort", "quit"})
ONE_PROCESS = "one process"
"""The guard of a branch that runs without a process group (``Ctx.guard``)."""


@dataclass(frozen=True, order=True)
class RawFinding:
    """A rule violation at a place in the file (``col`` 0-based, as in :mod:`ast`)."""

    line: int
    col: int
    code: str
    detail: str = ""


@dataclass(frozen=True)
class Ctx:
    """The context of one statement of the walk (see the module docstring)."""

    rank0: bool = False  # only rank 0 runs this code
    others: bool = False  # only the ranks other than 0 run it
    rank_dep: bool = False  # only some ranks run it
    local_only: bool = False  # "rank 0" by node-local guards only: local rank 0 of each node
    one_rank: bool = False  # one rank only, not 0 (`if rank == 1:` in an RPC script)
    all_but_one: bool = False  # every rank but one (`if rank != args.main_rank:`)
    guard: str = ""  # the innermost rank-0 guard, for the evidence
    excused: frozenset[str] = frozenset()  # collectives every branch of the guard calls
    in_except: bool = False
    exits: bool = False  # in a block that ends the program (an error message, then exit)
    no_sync: bool = False
    per_rank_block: bool = False  # a block of prints labelled with the rank
    guarded_here: bool = False  # a rank guard of this function (not only of its callers)
    launcher: bool = False  # after `if worker_mode: run_worker(); return`: the parent's code
    prelaunch: bool = False  # before a Fabric's launch(): the launching process first, alone
    optional: frozenset[str] = frozenset()  # names an enclosing `if` tested against None
    loops: tuple[ast.stmt, ...] = ()
    # the `A or B` tests of enclosing ifs not read as rank guards: a nested `if not A:` (or
    # `if X:` under `if not X or B:`) leaves B to hold, maybe a rank-0 test
    disjunctions: tuple[ast.BoolOp, ...] = ()
    dead: bool = False  # a call site inside a function nothing calls
    # after `if not flag and not is_rank0: return`: (the fact that fails a flag part, the
    # context before the return, its line) - a branch on the flag runs on those ranks again
    released: tuple[tuple[frozenset[tuple[str, bool]], Ctx, int], ...] = ()


def entry_context(sites: list[Ctx], name: str = "") -> Ctx:
    """The context a function's body starts in, from its call sites' contexts (none: the
    default). Rank 0 only when every site is; one process only when every site is one (a
    helper the DDP path also calls runs on every rank).

    ``name`` is the function's: a special method runs where Python calls it (a model's
    ``__call__``, a dataset's ``__getitem__``), not at call sites of its name, so it starts
    in the default context; except ``__init__``, whose sites are the calls of its class
    (``CSVLogger(...)`` made under ``if is_main_process():`` runs its ``__init__`` on rank 0).
    Sites inside functions nothing calls (``Ctx.dead``) count only when no other site exists.

    Example:
        >>> one = Ctx(rank0=True, guard=ONE_PROCESS)
        >>> entry_context([one, Ctx()]).guard, entry_context([one]).guard
        ('', 'one process')
    """
    if not sites or (name.startswith("__") and name != "__init__"):
        return Ctx()
    sites = [s for s in sites if not s.dead] or sites  # the live callers, when there are any
    rank0 = all(s.rank0 for s in sites)
    if all(s.guard == ONE_PROCESS for s in sites):
        guard = ONE_PROCESS
    else:
        guard = next((s.guard for s in sites if s.guard and s.guard != ONE_PROCESS), "")
    return Ctx(
        rank0=rank0,
        one_rank=not rank0 and all(s.rank0 or s.one_rank for s in sites),
        rank_dep=all(s.rank_dep for s in sites),
        launcher=all(s.launcher for s in sites),
        prelaunch=all(s.prelaunch for s in sites),
        local_only=rank0 and any(s.local_only for s in sites),
        guard=guard,
    )


def terminates(body: list[ast.stmt]) -> bool:
    """Whether a block always leaves: return, raise, continue, break or sys.exit()."""
    last = body[-1] if body else None
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return tail(dotted(last.value.func)) in _EXITS
    return False


def ends_program(body: list[ast.stmt]) -> bool:
    """A branch that gives up: ``print(error); sys.exit(1)``, ``raise``, a bare ``return``."""
    last = body[-1] if body else None
    if isinstance(last, ast.Raise) or (isinstance(last, ast.Return) and last.value is None):
        return True
    return (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and tail(dotted(last.value.func)) in _EXITS
    )


def none_tested(test: ast.expr) -> frozenset[str]:
    """Names a condition requires to be set: ``if writer is not None and ...``, ``if writer``."""
    found = set()
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for part in parts:
        if isinstance(part, ast.Compare) and isinstance(part.ops[0], ast.IsNot):
            name = dotted(part.left)
        else:
            name = dotted(part) if isinstance(part, (ast.Name, ast.Attribute)) else None
        if name is not None:
            found.add(name)
    return frozenset(found)


def names_node(call: ast.Call, facts: ModuleFacts) -> bool:
    """A path that names the node (``f"ckpt_{node_rank}.pt"``, the hostname): one per node."""
    for node in ast.walk(call):
        name = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        last = tail(facts.imports.resolve(name)).lower()
        if "node" in last or last == "gethostname":
            return True
    return False
