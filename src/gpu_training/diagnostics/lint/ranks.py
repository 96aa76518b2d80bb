"""Which ranks run what: the collectives of a file and the rules that depend on the rank.

The walk of :mod:`~gpu_training.diagnostics.lint.checks` knows, at each call, whether all
ranks run it, rank 0 only or the others only. This module answers the rank questions it asks
there, and holds the rules whose verdict depends on the answer:

* :class:`RankAnalysis` — per file: which functions run a collective (directly or through
  another function of the file), which create the process group, and which scopes run in
  every rank's process (a launcher's own code in the same file does not);
* collectives under a rank guard (``GT009``; which of them pair up across ranks is
  :mod:`~gpu_training.diagnostics.lint.paired_collectives`);
* learning-rate and optimizer changes under a rank guard (``GT014``);
* writes and logs that every rank makes (``GT007``, ``GT008``).

It is separate from the walk because these are facts about the whole file's call graph (a
function that all-reduces makes its callers collectives too), computed once, before the walk.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("import torch.distributed as dist\\n"
    ...                  "def sync(t):\\n    dist.all_reduce(t)\\n"
    ...                  "sync(x)\\n")
    >>> facts = ModuleFacts(tree)
    >>> RankAnalysis(facts, distributed=True).collective(tree.body[2].value, facts.module_scope)
    'sync(), which calls all_reduce (line 3)'
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.branch_optimizers import built_in_branch
from gpu_training.diagnostics.lint.calls import call_arg, keyword_arg, tail
from gpu_training.diagnostics.lint.collectives import (
    DIST_SETUP_CALLS,
    direct_collective,
    switched_off,
)
from gpu_training.diagnostics.lint.displayed import displayed_only
from gpu_training.diagnostics.lint.early_ranks import rank_read_before_group
from gpu_training.diagnostics.lint.frameworks import fabric_launch
from gpu_training.diagnostics.lint.guards import mentions_main_or_rank, rank_derived
from gpu_training.diagnostics.lint.handles import appended_by_rank0_only, one_literal_path
from gpu_training.diagnostics.lint.library_writes import download_target, saved_to
from gpu_training.diagnostics.lint.log_files import truncated_log_file
from gpu_training.diagnostics.lint.lr_assignments import rank_dependent_assignments
from gpu_training.diagnostics.lint.model import (
    ModuleFacts,
    Scope,
    call_name,
    dotted,
    iter_scope_nodes,
)
from gpu_training.diagnostics.lint.node_paths import copied_to
from gpu_training.diagnostics.lint.overwritten_parameters import overwritten_parameters
from gpu_training.diagnostics.lint.pipeline_schedules import is_pipeline_schedule
from gpu_training.diagnostics.lint.rank_values import rank_in_value
from gpu_training.diagnostics.lint.temp_paths import private_temp_path
from gpu_training.diagnostics.lint.trainer_callbacks import hook_methods

__all__ = [
    "RankAnalysis",
    "every_rank_log",
    "every_rank_write",
    "logs_silenced_per_rank",
    "rank_dependent_assignments",
    "rank_dependent_update",
    "rank_in_value",
]

_Func = ast.FunctionDef | ast.AsyncFunctionDef
_FRAMEWORK_SETUP = frozenset({"Accelerator", "Fabric", "PartialState"})
# Built under `accelerate launch`, these join (or make) the group: every process ran the code
# before them, as it runs the code before `init_process_group` under torchrun.
_FRAMEWORK_GROUPS = frozenset({"Accelerator", "PartialState"})
_MODEL_WRAPPERS = frozenset(
    {"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "fully_shard"}
)


def _callee(call: ast.Call, facts: ModuleFacts) -> tuple[str, str, str | None]:
    """A call's qualified callee name, its last part, and the method name (None: not one)."""
    name = call_name(call, facts.imports)
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    return name, tail(name), method


class RankAnalysis:
    """The collectives and the process group's reach in one file, computed once per file.

    Args:
        facts: The file's facts.
        distributed: Whether the file uses ``torch.distributed`` at all, or runs in the
            processes of a script that does (when not, no scope runs "on every rank").
        seeds: Functions of the file that other files call from code every rank runs.

    Attributes:
        collective_functions: Each function of the file that runs a collective, with what it
            runs (``"all_reduce (line 12)"``, ``"sync() (line 30)"``).
        group_creators: The scopes that create the process group, directly or by calling one
            that does.
        every_rank_scopes: The scopes that run in every rank's process (where printing and
            writing count).
    """

    def __init__(
        self, facts: ModuleFacts, distributed: bool, seeds: frozenset[ast.AST] = frozenset()
    ) -> None:
        self.facts = facts
        self.seeds = seeds
        self._switching: set[_Func] = set()
        self.collective_functions = self._collective_functions()
        self.group_creators: set[ast.AST] = set()
        self.every_rank_scopes: set[ast.AST] = set()
        if distributed:
            self.group_creators, self.every_rank_scopes = self._distributed_scopes()
        self._collectives_cache: dict[int, frozenset[str]] = {}
        self._creates: dict[int, bool] = {}  # id(statement) -> whether it makes the group

    def collective(self, call: ast.Call, scope: Scope) -> str | None:
        """The collective a call runs, itself or through a function of this file.

        Returns:
            Its name as reported (``"validate(), which calls all_reduce (line 9)"``), or None.
        """
        direct = direct_collective(call, scope, self.facts)
        if direct is not None:
            return direct
        for func in self.facts.local_functions(call):
            inner = self.collective_functions.get(func)
            if inner is not None and not self._switched_off(self.facts, func, call):
                return f"{func.name}(), which calls {inner}"
        return self._summary_collective(call)

    def _summary_collective(self, call: ast.Call) -> str | None:
        """The collective a function of another module runs (``self.checkpointer.save()``)."""
        for callee, func in self.facts.callees(call):
            summary = self.facts.resolver.summary((callee, func)) if self.facts.resolver else None
            if (
                callee is not self.facts
                and summary is not None
                and summary.collective
                and not self._switched_off(callee, func, call)
            ):
                return f"{summary.where}, which calls {summary.collective}"
        return None

    def _switched_off(self, owner: ModuleFacts, func: _Func, call: ast.Call) -> bool:
        """The call's literal arguments turn off the function's collectives
        (``torch_distributed_zero_first(-1)``, ``evaluate(model, distributed=False)``)."""
        if func in self._switching:
            return False
        scope = owner.scope_of(func)

        def runs(sub: ast.Call) -> bool:
            if direct_collective(sub, scope, owner) is not None:
                return True
            if owner is self.facts:
                return self.collective(sub, scope) is not None
            return any(s.collective for s in owner.summaries(sub))

        self._switching.add(func)
        try:
            return switched_off(func, call, runs)
        finally:
            self._switching.discard(func)

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
        """Whether ``stmts`` create the process group (directly or through this file's code);
        each statement's answer kept (an ``if`` asks of its branches, and of the blocks around
        it, for every ``if`` nested in it)."""
        return any(self._statement_creates_group(s) for s in stmts)

    def _statement_creates_group(self, stmt: ast.stmt) -> bool:
        key = id(stmt)
        found = self._creates.get(key)
        if found is None:
            found = self._creates[key] = self._creates_group([stmt])
        return found

    def _creates_group(self, stmts: list[ast.stmt]) -> bool:
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
            if any(s.creates_group for s in self.facts.summaries(node)):
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
                # its own collective, or one of another module's function it calls
                name = direct_collective(call, scope, self.facts) or self._summary_collective(call)
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
        relaunches = bool(fabric_launch(self.facts).scopes)
        wraps: set[ast.AST] = set()  # scopes that wrap a model for data parallelism
        for node, scope in self.facts.scopes.items():
            calls[node] = set()
            for sub in self.facts.scope_nodes.get(node, []):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                    calls[node].update(self.facts.functions.get(sub.id, []))  # `submit(save)`
                if isinstance(sub, (ast.Name, ast.Call)):  # `callbacks=[SaveCallback()]`
                    calls[node].update(
                        f for o, f in hook_methods(self.facts, sub) if o is self.facts
                    )
                if not isinstance(sub, ast.Call):
                    continue
                calls[node].update(self.facts.local_functions(sub))
                name = call_name(sub, self.facts.imports)
                last = tail(name)
                helpers = [
                    self.facts.resolver.summary(ref)
                    for ref in self.facts.callees(sub)
                    if ref[0] is not self.facts and self.facts.resolver is not None
                ]
                if (
                    last in ("init_process_group", "init_distributed")
                    or any(h.creates_group for h in helpers)
                    or name == "deepspeed.initialize"
                    or last in _FRAMEWORK_GROUPS
                    or (last == "launch" and relaunches)
                ):  # it creates the group when none exists
                    creates.add(node)
                if last in _MODEL_WRAPPERS:
                    wraps.add(node)
                if (
                    last in DIST_SETUP_CALLS
                    or last in _FRAMEWORK_SETUP
                    or last in ("get_rank", "get_world_size")
                    or name.startswith("torch.distributed.")
                    or direct_collective(sub, scope, self.facts) is not None
                    or any(h.distributed for h in helpers)
                ):
                    direct.add(node)
        direct |= self.seeds
        changed = True
        launchers = self._launchers()
        while changed:  # callers of group creators (not through the parent that spawns them)
            changed = False
            for node, callees in calls.items():
                if node not in creates and node not in launchers and callees & creates:
                    creates.add(node)
                    changed = True
                # every rank wraps its own replica: `model.configure_fsdp()` runs on all of them
                if node not in wraps and node not in launchers and callees & wraps:
                    wraps.add(node)
                    changed = True
        found = (direct | creates | wraps) - launchers
        todo = list(found)
        while todo:  # callees of distributed code
            for callee in calls.get(todo.pop(), set()):
                if callee not in found and callee not in launchers:
                    found.add(callee)
                    todo.append(callee)
        return creates, found

    def _launchers(self) -> set[ast.AST]:
        """Scopes that start the ranks (``mp.spawn(worker, ...)``, or a function of another
        module that does) and do not create a group themselves: the parent process runs them
        once."""
        found = set()
        resolver = self.facts.resolver
        for node in self.facts.scopes:
            for sub in self.facts.scope_nodes.get(node, []):
                if not isinstance(sub, ast.Call):
                    continue
                name = call_name(sub, self.facts.imports)
                if "multiprocessing" in name and tail(name) in ("spawn", "start_processes"):
                    found.add(node)
                elif resolver is not None and any(
                    resolver.summary(ref).spawns
                    for ref in self.facts.callees(sub)
                    if ref[0] is not self.facts
                ):
                    found.add(node)  # `device_agnostic_run(config, world_size)` spawns them
                if tail(name) in ("init_process_group", "init_distributed"):
                    found.discard(node)
                    break
        return found


# --- updates under a rank guard ---------------------------------------------------------------


def rank_dependent_update(call: ast.Call, scope: Scope, facts: ModuleFacts) -> str | None:
    """``GT014`` for a call under a rank guard: does it change the LR, step an optimizer or
    overwrite the trained weights (:mod:`.overwritten_parameters`)?

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
        return None if displayed_only(call, facts) else f"{last}()"
    if method == "copy_to":  # `ema.copy_to(model.parameters())` on rank 0, mid-training
        return overwritten_parameters(call, facts)
    if method != "step":
        return None
    assert isinstance(call.func, ast.Attribute)
    receiver = call.func.value
    kinds = facts.kinds(receiver, scope)
    label = tail(dotted(receiver)).lower()
    if is_pipeline_schedule(receiver, facts):  # a pipeline step, every stage its own part
        return None
    if built_in_branch(facts, call, scope):  # the other ranks hold no replica to diverge
        return None
    if kinds & {"scheduler", "optimizer", "scaler", "amp_stepper"} or any(
        word in label for word in ("sched", "optim", "scaler")
    ):
        return f"{dotted(receiver) or 'optimizer'}.step()"
    return None


# --- writes and logs on every rank ----------------------------------------------------------

_LOG_METHODS = frozenset({"info"})
_LOGGER_NAMES = frozenset({"logger", "log", "_logger", "_log"})
_BOARD_METHODS = frozenset(
    {"add_scalar", "add_scalars", "add_histogram", "add_image", "add_images", "add_text"}
)
_FILE_METHODS = frozenset(
    {
        "savefig",
        "save_pretrained",
        "to_csv",
        "to_json",
        "to_parquet",
        "export_chrome_trace",
        "save_to_disk",
    }
)


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
    elif name in ("open", "io.open", "codecs.open") and name not in facts.imports.names:
        mode = call_arg(call, 1, "mode")
        text = mode.value if isinstance(mode, ast.Constant) else None
        if isinstance(text, str) and set(text) & set("wax+"):
            path = None if appended_by_rank0_only(facts, call, scope) else call_arg(call, 0, "file")
    elif name == "logging.FileHandler":  # mode "w" empties the file: not an appended log
        path = truncated_log_file(call)
    elif method in ("write_text", "write_bytes"):
        assert isinstance(call.func, ast.Attribute)
        path, what = call.func.value, method
    elif method == "save" and one_literal_path(call):
        assert isinstance(call.func, ast.Attribute)
        path, what = call.args[0], f"{dotted(call.func.value) or 'object'}.save"
    elif method in _FILE_METHODS:
        assert isinstance(call.func, ast.Attribute)
        given = call.args[0] if call.args else keyword_arg(call, "path_or_buf")
        if method in ("to_csv", "to_json") and given is None:
            return None  # no path: it returns the text
        path, what = (given if given is not None else call.func.value), method
    elif (copied := copied_to(call, facts)) is not None:  # shutil.copy(src, dst): dst written
        path, what = copied, name
    elif (download := download_target(call, name)) is not None:  # CIFAR10(download=True)
        path, what = download
    elif (saved := saved_to(call, name, facts.imports.names)) is not None:
        path, what = saved, name  # OmegaConf.save(cfg, path)
    if path is None or _caller_decides(path, scope, facts):
        return None
    if facts.mentions_rank(call) or private_temp_path(facts, path, scope):
        return None  # one file per rank, or a private temporary file
    if rank_in_value(facts, path, scope) and not rank_read_before_group(facts, path, scope):
        return None  # save_path = f"ckpt.rank{rank}"; torch.save(state, save_path)
    if dotted(path) == "os.devnull" or facts.kinds(path, scope) & {"buffer"}:
        return None
    return what


def _caller_decides(path: ast.expr, scope: Scope, facts: ModuleFacts) -> bool:
    """The path is a parameter of the function with no literal default, and no call in this
    file passes it a path without the rank: the callers choose it (one per rank, or not), so
    nothing here says every rank writes the same file."""
    func = scope.node
    if not isinstance(path, ast.Name) or not isinstance(
        func, (ast.FunctionDef, ast.AsyncFunctionDef)
    ):
        return False
    args = func.args
    positional = [*args.posonlyargs, *args.args]
    defaults: dict[str, ast.expr | None] = {a.arg: None for a in positional}
    tail_args = positional[len(positional) - len(args.defaults) :]
    for arg, literal in zip(tail_args, args.defaults, strict=True):
        defaults[arg.arg] = literal
    for arg, maybe in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        defaults[arg.arg] = maybe
    if args.vararg is not None:
        defaults[args.vararg.arg] = None
    if path.id not in defaults:
        return False
    default = defaults[path.id]
    if isinstance(default, ast.Constant) and isinstance(default.value, str):
        return False
    names = [a.arg for a in positional]
    index = -1  # keyword-only or `*args`: passed by keyword alone
    if path.id in names:
        index = names.index(path.id) - (1 if names and names[0] in ("self", "cls") else 0)
    passed: list[tuple[ModuleFacts, ast.expr | None, Scope]] = []
    for sub, where in facts.calls_of(func):
        value = keyword_arg(sub, path.id)
        if value is None and path.id in names and 0 <= index < len(sub.args):
            value = sub.args[index]
        passed.append((facts, value, where))
    if facts.resolver is not None:  # the project's other modules that call it
        for owner, sub, where in facts.resolver.incoming((facts, func)):
            value = keyword_arg(sub, path.id)
            if value is None and path.id in names and 0 <= index < len(sub.args):
                value = sub.args[index]
            passed.append((owner, value, where))
    shared = [v for f, v, w in passed if v is not None and not rank_in_value(f, v, w)]
    return not passed or len(shared) < len(passed)


def logs_silenced_per_rank(calls: list[ast.Call], facts: ModuleFacts) -> bool:
    """Whether the file sets its log level by rank, which already silences the other ranks.

    ``logger.setLevel(INFO if is_main else WARN)``, ``logging.basicConfig(level=... rank ...)``.
    """
    return any(
        isinstance(c.func, ast.Attribute)
        and c.func.attr in ("setLevel", "basicConfig", "set_verbosity")
        and mentions_main_or_rank(facts, c)
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
    if what is not None and not _labelled_with_rank(call, scope, facts):
        return what
    return None


def _labelled_with_rank(call: ast.Call, scope: Scope, facts: ModuleFacts) -> bool:
    """A message that names its rank or process (``print(f"[GPU{self.gpu_id}] ...")`` with
    ``gpu_id`` a rank, ``os.getpid()``): one line per rank, each telling which."""
    if facts.mentions_rank(call):
        return True
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        for node in ast.walk(arg):
            if isinstance(node, ast.Call) and tail(dotted(node.func)) in ("getpid", "gethostname"):
                return True
            if isinstance(node, (ast.Name, ast.Attribute)) and rank_derived(facts, node, scope):
                return True
        if rank_in_value(facts, arg, scope):
            return True
    return False
