"""Which ranks run what: the collectives of a file and the rules that depend on the rank.

The walk of :mod:`~gpu_training.diagnostics.lint_checks` knows, at each call, whether all
ranks run it, rank 0 only or the others only. This module answers the rank questions it asks
there, and holds the rules whose verdict depends on the answer:

* :class:`RankAnalysis` — per file: which functions run a collective (directly or through
  another function of the file), which create the process group, and which scopes run in
  every rank's process (a launcher's own code in the same file does not);
* collectives under a rank guard (``GT009``, :func:`unpaired_collectives`), except the
  "rank 0 goes first" barrier pair;
* learning-rate and optimizer changes under a rank guard (``GT014``);
* writes and logs that every rank makes (``GT007``, ``GT008``).

It is separate from the walk because these are facts about the whole file's call graph (a
function that all-reduces makes its callers collectives too), computed once, before the walk.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint_model import ModuleFacts
    >>> tree = ast.parse("import torch.distributed as dist\\n"
    ...                  "def sync(t):\\n    dist.all_reduce(t)\\n"
    ...                  "sync(x)\\n")
    >>> facts = ModuleFacts(tree)
    >>> RankAnalysis(facts, distributed=True).collective(tree.body[2].value, facts.module_scope)
    'sync(), which calls all_reduce (line 3)'
"""

from __future__ import annotations

import ast
from typing import NamedTuple

from gpu_training.diagnostics.lint_calls import call_arg, keyword_arg, tail
from gpu_training.diagnostics.lint_model import (
    ModuleFacts,
    Scope,
    call_name,
    dotted,
    iter_scope_nodes,
)

__all__ = [
    "DIST_SETUP_CALLS",
    "GuardedCollective",
    "RankAnalysis",
    "every_rank_log",
    "every_rank_write",
    "logs_silenced_per_rank",
    "rank_dependent_assignments",
    "rank_dependent_update",
    "unpaired_collectives",
]

_Func = ast.FunctionDef | ast.AsyncFunctionDef

DIST_SETUP_CALLS = frozenset(
    {
        "init_process_group",
        "init_distributed",
        "DistributedDataParallel",
        "DDP",
        "FullyShardedDataParallel",
        "FSDP",
        "fully_shard",
        "DistributedSampler",
        "make_distributed_sampler",
        "GlobalBatchSampler",
        "wrap_model",
    }
)
"""Callee names (last part) that set up distributed training: a process group, a wrapper, a
distributed sampler."""

_COLLECTIVES = frozenset(
    {
        "barrier",
        "monitored_barrier",
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "all_to_all",
        "all_to_all_single",
        "new_group",
        "init_process_group",
        "get_model_state_dict",
        "get_optimizer_state_dict",
        "get_state_dict",
    }
)
_TOOLKIT_COLLECTIVES = frozenset(
    {
        "reduce_scalar_dict",
        "train_one_epoch",
        "capture_training_state",
        "gather_rng_states",
        "init_distributed",
        "cleanup_distributed",
    }
)
_CKPT_COLLECTIVE_METHODS = frozenset({"save", "wait", "close", "save_sharded", "load_sharded"})


# --- collectives ----------------------------------------------------------------------------


def _direct_collective(call: ast.Call, scope: Scope, facts: ModuleFacts) -> str | None:
    """The collective a call itself runs (not through this file's functions), if any.

    Args:
        call: The call.
        scope: Where it appears (for the kinds of its receiver).
        facts: The file's facts.

    Returns:
        Its name as reported (``all_reduce``, ``CheckpointManager.save``…), or None.
    """
    name, last, method = _callee(call, facts)
    head = name.split(".")[0]
    if last in _COLLECTIVES and (
        name.startswith("torch.distributed") or head in ("dist", "distributed")
    ):
        return last
    if method in ("barrier", "monitored_barrier", "wait_for_everyone"):
        return method
    if last in _TOOLKIT_COLLECTIVES or (
        last == "find_max_batch_size" and keyword_arg(call, "ctx") is not None
    ):
        return last
    if name.startswith("torch.distributed.checkpoint") and last in ("save", "load"):
        return f"dcp.{last}"
    if isinstance(call.func, ast.Attribute):
        kinds = facts.kinds(call.func.value, scope)
        if method in _CKPT_COLLECTIVE_METHODS and "ckpt_manager" in kinds:
            return f"CheckpointManager.{method}"
        if method == "state_dict" and "fsdp" in kinds:
            return "FSDP state_dict (all-gather)"
    return None


def _callee(call: ast.Call, facts: ModuleFacts) -> tuple[str, str, str | None]:
    """A call's qualified callee name, its last part, and the method name (None: not one)."""
    name = call_name(call, facts.imports)
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    return name, tail(name), method


class RankAnalysis:
    """The collectives and the process group's reach in one file, computed once per file.

    Args:
        facts: The file's facts.
        distributed: Whether the file uses ``torch.distributed`` at all (when not, no scope
            runs "on every rank" and no function creates the group).

    Attributes:
        collective_functions: Each function of the file that runs a collective, with what it
            runs (``"all_reduce (line 12)"``, ``"sync() (line 30)"``).
        group_creators: The scopes that create the process group, directly or by calling one
            that does.
        every_rank_scopes: The scopes that run in every rank's process (where printing and
            writing count).
    """

    def __init__(self, facts: ModuleFacts, distributed: bool) -> None:
        self.facts = facts
        self.collective_functions = self._collective_functions()
        self.group_creators: set[ast.AST] = set()
        self.every_rank_scopes: set[ast.AST] = set()
        if distributed:
            self.group_creators, self.every_rank_scopes = self._distributed_scopes()
        self._collectives_cache: dict[int, frozenset[str]] = {}

    def collective(self, call: ast.Call, scope: Scope) -> str | None:
        """The collective a call runs, itself or through a function of this file.

        Returns:
            Its name as reported (``"validate(), which calls all_reduce (line 9)"``), or None.
        """
        direct = _direct_collective(call, scope, self.facts)
        if direct is not None:
            return direct
        for func in self.facts.local_functions(call):
            inner = self.collective_functions.get(func)
            if inner is not None:
                return f"{func.name}(), which calls {inner}"
        return None

    def collectives_in(self, stmts: list[ast.stmt], scope: Scope) -> frozenset[str]:
        """The names of the collectives a block runs (nested functions excluded)."""
        if not stmts:
            return frozenset()
        key = id(stmts[0])
        cached = self._collectives_cache.get(key)
        if cached is not None:
            return cached
        names = set()
        for node in iter_scope_nodes(stmts):
            if isinstance(node, ast.Call):
                found = self.collective(node, scope)
                if found is not None:
                    names.add(found.split("(")[0])
        self._collectives_cache[key] = frozenset(names)
        return self._collectives_cache[key]

    def creates_group(self, stmts: list[ast.stmt]) -> bool:
        """Whether ``stmts`` create the process group (directly or through this file's code)."""
        for node in iter_scope_nodes(stmts):
            if not isinstance(node, ast.Call):
                continue
            if tail(call_name(node, self.facts.imports)) in (
                "init_process_group",
                "init_distributed",
            ):
                return True
            if any(f in self.group_creators for f in self.facts.local_functions(node)):
                return True
        return False

    def _collective_functions(self) -> dict[_Func, str]:
        found: dict[_Func, str] = {}
        funcs = [n for n in self.facts.scopes if not isinstance(n, ast.Module)]
        calls: dict[_Func, list[ast.Call]] = {}
        for func in funcs:
            assert isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
            scope = self.facts.scope_of(func)
            nodes = self.facts.scope_nodes.get(func, [])
            calls[func] = [n for n in nodes if isinstance(n, ast.Call)]
            for call in calls[func]:
                name = _direct_collective(call, scope, self.facts)
                if name is not None:
                    found[func] = f"{name} (line {call.lineno})"
                    break
        changed = True
        while changed:
            changed = False
            for func, func_calls in calls.items():
                if func in found:
                    continue
                for call in func_calls:
                    callee = next((f for f in self.facts.local_functions(call) if f in found), None)
                    if callee is not None:
                        found[func] = f"{callee.name}() (line {call.lineno})"
                        changed = True
                        break
        return found

    def _distributed_scopes(self) -> tuple[set[ast.AST], set[ast.AST]]:
        """The scopes that create the group, and those that run in every rank's process.

        A scope is distributed when it sets up or uses the process group itself, when it calls
        a function that creates the group (``main()`` calling ``setup()``), or when a
        distributed scope calls it. A launcher's own code in the same file (the parent that
        starts the ranks) is not.
        """
        calls: dict[ast.AST, set[ast.AST]] = {}
        direct: set[ast.AST] = set()
        creates: set[ast.AST] = set()
        for node, scope in self.facts.scopes.items():
            calls[node] = set()
            for sub in self.facts.scope_nodes.get(node, []):
                if not isinstance(sub, ast.Call):
                    continue
                calls[node].update(self.facts.local_functions(sub))
                name = call_name(sub, self.facts.imports)
                last = tail(name)
                if last in ("init_process_group", "init_distributed"):
                    creates.add(node)
                if (
                    last in DIST_SETUP_CALLS
                    or last in ("get_rank", "get_world_size")
                    or name.startswith("torch.distributed.")
                    or _direct_collective(sub, scope, self.facts) is not None
                ):
                    direct.add(node)
        changed = True
        while changed:  # callers of group creators
            changed = False
            for node, callees in calls.items():
                if node not in creates and callees & creates:
                    creates.add(node)
                    changed = True
        found = direct | creates
        todo = list(found)
        while todo:  # callees of distributed code
            for callee in calls.get(todo.pop(), set()):
                if callee not in found:
                    found.add(callee)
                    todo.append(callee)
        return creates, found


class GuardedCollective(NamedTuple):
    """A collective that runs under a rank guard of its own function (``GT009`` candidate)."""

    call: ast.Call
    collective: str
    """Its name as reported by :meth:`RankAnalysis.collective`."""
    side: str
    """Which ranks reach it: ``"rank0"``, ``"others"`` (every rank but 0) or ``"some"``."""
    where: ast.AST
    """The scope (function or module) it is in."""


def unpaired_collectives(guarded: list[GuardedCollective]) -> list[GuardedCollective]:
    """``GT009``: the guarded collectives, except those that rank 0 and the others both reach.

    ``if rank != 0: dist.barrier()`` ... ``if rank == 0: dist.barrier()`` is the classic
    "rank 0 goes first" idiom (download, preprocess, then release the others): the two
    barriers meet. Same function, same collective, as many calls on each side: paired.

    Args:
        guarded: Every collective found under a rank guard, in walk order.

    Returns:
        The ones to report.
    """
    sides: dict[tuple[int, str], dict[str, int]] = {}
    for _, collective, side, where in guarded:
        key = (id(where), collective.split("(")[0])
        sides.setdefault(key, {"rank0": 0, "others": 0, "some": 0})[side] += 1
    unpaired: list[GuardedCollective] = []
    for entry in guarded:
        count = sides[(id(entry.where), entry.collective.split("(")[0])]
        if entry.side != "some" and count["rank0"] == count["others"]:
            continue
        unpaired.append(entry)
    return unpaired


# --- updates under a rank guard ---------------------------------------------------------------


def rank_dependent_update(call: ast.Call, scope: Scope, facts: ModuleFacts) -> str | None:
    """``GT014`` for a call under a rank guard: does it change the LR or step an optimizer?

    Args:
        call: The call (under a rank guard of its own function).
        scope: Where it appears.
        facts: The file's facts.

    Returns:
        What to report (``"adjust_learning_rate()"``, ``"scheduler.step()"``), or None.
    """
    _, last, method = _callee(call, facts)
    tokens = last.lower().split("_")
    if ("lr" in tokens or ("learning" in tokens and "rate" in tokens)) and tokens[0] not in (
        "get",
        "print",
        "log",
        "show",
        "format",
    ):
        return f"{last}()"
    if method != "step":
        return None
    assert isinstance(call.func, ast.Attribute)
    receiver = call.func.value
    kinds = facts.kinds(receiver, scope)
    label = tail(dotted(receiver)).lower()
    if kinds & {"scheduler", "optimizer", "scaler", "amp_trainer"} or any(
        word in label for word in ("sched", "optim", "scaler")
    ):
        return f"{dotted(receiver) or 'optimizer'}.step()"
    return None


def rank_dependent_assignments(stmt: ast.stmt) -> list[tuple[ast.expr, str]]:
    """``GT014`` for a statement under a rank guard: ``group['lr'] = ...`` and the like.

    Returns:
        ``(target, detail)`` for each assignment to an ``['lr']``/``['learning_rate']`` key.
    """
    if not isinstance(stmt, (ast.Assign, ast.AugAssign)):
        return []
    found: list[tuple[ast.expr, str]] = []
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    for target in targets:
        key = target.slice if isinstance(target, ast.Subscript) else None
        if isinstance(key, ast.Constant) and key.value in ("lr", "learning_rate"):
            found.append((target, f"['{key.value}'] set"))
    return found


# --- writes and logs on every rank ----------------------------------------------------------

_LOG_METHODS = frozenset({"info"})
_LOGGER_NAMES = frozenset({"logger", "log", "_logger", "_log"})
_BOARD_METHODS = frozenset(
    {"add_scalar", "add_scalars", "add_histogram", "add_image", "add_images", "add_text"}
)
_FILE_METHODS = frozenset({"savefig", "save_pretrained", "to_csv", "to_json", "to_parquet"})


def every_rank_write(call: ast.Call, scope: Scope, facts: ModuleFacts) -> str | None:
    """``GT007`` for a call that every rank runs: does it write a shared file?

    Args:
        call: The call (in a scope that every rank runs, outside any rank-0 guard).
        scope: Where it appears.
        facts: The file's facts.

    Returns:
        What writes (``"save"``, ``"open"``, ``"savefig"``…), or None: not a write, or one file
        per rank, a temporary file, a buffer.
    """
    name, last, method = _callee(call, facts)
    path: ast.expr | None = None
    what = last
    if name == "torch.save":
        path = call_arg(call, 1, "f")
    elif (last == "save_file" and "safetensors" in name) or name == "save_file":
        path = call_arg(call, 1, "filename")
    elif name in ("numpy.save", "numpy.savez", "numpy.savez_compressed", "numpy.savetxt"):
        path = call_arg(call, 0, "file")
    elif name in ("open", "io.open") and name not in facts.imports.names:
        mode = call_arg(call, 1, "mode")
        text = mode.value if isinstance(mode, ast.Constant) else None
        if isinstance(text, str) and set(text) & set("wax+"):
            path = call_arg(call, 0, "file")
    elif method in ("write_text", "write_bytes"):
        assert isinstance(call.func, ast.Attribute)
        path, what = call.func.value, method
    elif method in _FILE_METHODS:
        assert isinstance(call.func, ast.Attribute)
        path, what = (call.args[0] if call.args else call.func.value), method
    if path is None:
        return None
    if facts.mentions_rank(call) or facts.kinds(path, scope) & {"tempfile"}:
        return None  # one file per rank, or a private temporary file
    if dotted(path) == "os.devnull" or facts.kinds(path, scope) & {"buffer"}:
        return None
    return what


def logs_silenced_per_rank(calls: list[ast.Call], facts: ModuleFacts) -> bool:
    """Whether the file sets its log level by rank, which already silences the other ranks.

    ``logger.setLevel(INFO if is_main else WARN)``, ``logging.basicConfig(level=... rank ...)``.
    """
    return any(
        isinstance(c.func, ast.Attribute)
        and c.func.attr in ("setLevel", "basicConfig", "set_verbosity")
        and facts.mentions_main_or_rank(c)
        for c in calls
    )


def every_rank_log(
    call: ast.Call, scope: Scope, facts: ModuleFacts, level_per_rank: bool
) -> str | None:
    """``GT008`` for a call that every rank runs: does it print, log or report metrics?

    Args:
        call: The call (in a scope that every rank runs, outside any rank-0 guard and any
            ``except`` block).
        scope: Where it appears.
        facts: The file's facts.
        level_per_rank: :func:`logs_silenced_per_rank` of the file (``logging.info`` and
            ``logger.info`` are then fine).

    Returns:
        What logs (``"print"``, ``"logger.info"``, ``"wandb.log"``, ``"tqdm"``…), or None: not a
        log, or a message that names the rank.
    """
    name, last, method = _callee(call, facts)
    what: str | None = None
    if isinstance(call.func, ast.Name) and call.func.id == "print":
        if "print" not in facts.imports.names and keyword_arg(call, "file") is None:
            what = "print"
    elif name == "logging.info" and not level_per_rank:
        what = name
    elif method in _LOG_METHODS:
        assert isinstance(call.func, ast.Attribute)
        receiver = call.func.value
        is_logger = "logger" in facts.kinds(receiver, scope) or (
            tail(dotted(receiver)).lower() in _LOGGER_NAMES
        )
        if is_logger and not level_per_rank:
            what = f"logger.{method}"
    elif name.startswith(("wandb.", "mlflow.")) and last.startswith(("log", "init")):
        what = name
    elif method in _BOARD_METHODS or last == "SummaryWriter":
        what = method or last
    elif last in ("tqdm", "trange") and keyword_arg(call, "disable") is None:
        what = last
    if what is not None and not facts.mentions_rank(call):
        return what
    return None
