"""The checks behind ``gpu-training lint``: one AST walk per file finds every rule's pitfall.

The walk carries a context down the statements — does only rank 0 run this, or only some
ranks (``if rank == 0:``, the ``else`` of it, the rest of a function after
``if not ctx.is_main_process: return``)? is it inside ``no_sync()``? inside which loops? — and
hands every call to the rules. Functions of the file are followed: a function called only
under a rank-0 guard is rank-0 code, and one that runs a collective makes its call a
collective too (``if rank == 0: validate(model)`` where ``validate`` all-reduces).

Rule texts live in :mod:`~gpu_training.diagnostics.lint_rules`; the facts about names,
imports and guards in :mod:`~gpu_training.diagnostics.lint_model`.

Example:
    >>> import ast
    >>> source = "import torch\\nmodel = torch.nn.DataParallel(model)\\n"
    >>> [(f.code, f.line) for f in check_tree(ast.parse(source))]
    [('GT001', 2)]
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace

from gpu_training.diagnostics.lint_model import (
    GUARD_NOT_RANK0,
    GUARD_RANK0,
    ModuleFacts,
    Scope,
    call_name,
    dotted,
    iter_scope_nodes,
)

__all__ = ["RawFinding", "check_tree"]


@dataclass(frozen=True, order=True)
class RawFinding:
    """A rule violation at a place in the file (``col`` 0-based, as in :mod:`ast`)."""

    line: int
    col: int
    code: str
    detail: str = ""


@dataclass(frozen=True)
class _Ctx:
    rank0: bool = False  # only rank 0 runs this code
    others: bool = False  # only the ranks other than 0 run it
    rank_dep: bool = False  # only some ranks run it
    excused: frozenset[str] = frozenset()  # collectives every branch of the guard calls
    in_except: bool = False
    no_sync: bool = False
    per_rank_block: bool = False  # a block of prints labelled with the rank
    guarded_here: bool = False  # a rank guard of this function (not only of its callers)
    launcher: bool = False  # after `if worker_mode: run_worker(); return`: the parent's code
    loops: tuple[ast.stmt, ...] = ()


_Func = ast.FunctionDef | ast.AsyncFunctionDef

_DIST_SETUP = frozenset(
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
_WRAPPERS = frozenset(
    {"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "fully_shard"}
)
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
_OPTIMIZERS = frozenset(
    {
        "SGD",
        "Adam",
        "AdamW",
        "RMSprop",
        "Adagrad",
        "Adadelta",
        "Adamax",
        "NAdam",
        "RAdam",
        "SparseAdam",
        "LBFGS",
        "Lion",
        "Adafactor",
    }
)
_LOG_METHODS = frozenset({"info"})
_LOGGER_NAMES = frozenset({"logger", "log", "_logger", "_log"})
_BOARD_METHODS = frozenset(
    {"add_scalar", "add_scalars", "add_histogram", "add_image", "add_images", "add_text"}
)
_FILE_METHODS = frozenset({"savefig", "save_pretrained", "to_csv", "to_json", "to_parquet"})
_EVAL_NAME = re.compile(r"val|eval|test|dev", re.I)
_CUDA_INDEX = re.compile(r"^cuda:\d+$")
_NO_SYNC_CALLS = frozenset({"no_sync", "gradient_sync", "accumulate"})


def _tail(name: str | None) -> str:
    return "" if name is None else name.rsplit(".", 1)[-1]


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def _arg(call: ast.Call, index: int, name: str) -> ast.expr | None:
    value = _kw(call, name)
    if value is None and len(call.args) > index:
        candidate = call.args[index]
        value = None if isinstance(candidate, ast.Starred) else candidate
    return value


def _is_const(expr: ast.expr | None, value: object) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is value


def _terminates(body: list[ast.stmt]) -> bool:
    """Whether a block always leaves: return, raise, continue, break or sys.exit()."""
    last = body[-1] if body else None
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return _tail(dotted(last.value.func)) in ("exit", "_exit", "abort")
    return False


def _start(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


class _Checker:
    def __init__(self, tree: ast.Module) -> None:
        self.facts = ModuleFacts(tree)
        self.imports = self.facts.imports
        self.tree = tree
        self.all_calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        self.tails = {_tail(call_name(c, self.imports)) for c in self.all_calls}
        names = [call_name(c, self.imports) for c in self.all_calls]
        spawn = any("multiprocessing" in n and n.endswith("spawn") for n in names)
        self.dist_setup = bool(self.tails & _DIST_SETUP) or spawn
        # `dist.x()` with `dist` never imported nor bound: a snippet that assumes the import.
        bare_dist = "dist" not in self.imports.names and not any(
            "dist" in scope.bindings for scope in self.facts.scopes.values()
        )
        prefixes = ("torch.distributed.", "dist.") if bare_dist else ("torch.distributed.",)
        uses_dist = any(n.startswith(prefixes) for n in names)
        self.distributed = self.dist_setup or uses_dist
        self.has_wrapper = bool(self.tails & (_WRAPPERS | {"wrap_model"}))
        self.data_parallel = self.has_wrapper or bool(
            self.tails & {"DistributedSampler", "make_distributed_sampler"}
        )
        self.findings: set[RawFinding] = set()
        self.emit = False
        self.call_sites: dict[_Func, list[_Ctx]] = {}
        self.collective_fns = self._collective_functions()
        self.group_creators: set[ast.AST] = set()
        self.dist_scopes = self._distributed_scopes() if self.distributed else set()
        self.epoch_loops: list[ast.stmt] = []
        self.guarded_collectives: list[tuple[ast.Call, str, str, ast.AST]] = []
        # `logger.setLevel(INFO if is_main else WARN)`: the level already silences the others.
        self.log_level_guarded = any(
            isinstance(c.func, ast.Attribute)
            and c.func.attr in ("setLevel", "basicConfig", "set_verbosity")
            and self.facts.mentions_main_or_rank(c)
            for c in self.all_calls
        )
        self.default_cuda: list[tuple[ast.AST, str]] = []
        self._accum_cache: dict[ast.stmt, bool] = {}
        self._expr_cache: dict[ast.AST, tuple[list[ast.Call], list[_Func]]] = {}
        self._collectives_cache: dict[int, frozenset[str]] = {}
        self._scaler_scopes = self._scaler_scope_info()

    # --- driver ---------------------------------------------------------------------------

    def run(self) -> list[RawFinding]:
        functions = [node for node in self.facts.scopes if not isinstance(node, ast.Module)]
        entry: dict[_Func, _Ctx] = {f: _Ctx() for f in functions}  # type: ignore[misc]
        for _ in range(8):  # call-site contexts feed function entry contexts: to a fixpoint
            self.call_sites = {}
            self._walk(entry)
            updated = {f: self._entry_context(f) for f in entry}
            if updated == entry:
                break
            entry = updated
        self.emit = True
        self._walk(entry)
        self._file_level()
        return sorted(self.findings)

    def _walk(self, entry: dict[_Func, _Ctx]) -> None:
        module = self.facts.module_scope
        self._stmts(self.tree.body, _Ctx(), module)
        for func, ctx in entry.items():
            self._stmts(func.body, ctx, self.facts.scope_of(func))

    def _entry_context(self, func: _Func) -> _Ctx:
        sites = self.call_sites.get(func, [])
        if not sites or func.name.startswith("__"):
            return _Ctx()
        return _Ctx(
            rank0=all(s.rank0 for s in sites),
            rank_dep=all(s.rank_dep for s in sites),
            launcher=all(s.launcher for s in sites),
        )

    def add(self, node: ast.AST, code: str, detail: str = "") -> None:
        if self.emit:
            line, col = _start(node)
            self.findings.add(RawFinding(line, col, code, detail))

    # --- statements -----------------------------------------------------------------------

    def _stmts(self, stmts: list[ast.stmt], ctx: _Ctx, scope: Scope) -> None:
        labelled = any(self._is_rank_print(s) for s in stmts)
        for stmt in stmts:
            ctx = self._stmt(stmt, replace(ctx, per_rank_block=labelled), scope)

    def _is_rank_print(self, stmt: ast.stmt) -> bool:
        return (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name)
            and stmt.value.func.id == "print"
            and self.facts.mentions_rank(stmt.value)
        )

    def _stmt(self, stmt: ast.stmt, ctx: _Ctx, scope: Scope) -> _Ctx:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for expr in [*stmt.decorator_list, *stmt.args.defaults, *stmt.args.kw_defaults]:
                if expr is not None:
                    self._expr(expr, ctx, scope)
        elif isinstance(stmt, ast.ClassDef):
            for expr in [*stmt.decorator_list, *stmt.bases]:
                self._expr(expr, ctx, scope)
            self._stmts(stmt.body, ctx, scope)
        elif isinstance(stmt, ast.If):
            return self._if(stmt, ctx, scope)
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            self._expr(stmt.iter if not isinstance(stmt, ast.While) else stmt.test, ctx, scope)
            loader = not isinstance(stmt, ast.While) and self._iterates_loader(stmt.iter, scope)
            if loader and ctx.loops and self.emit:
                self.epoch_loops.append(ctx.loops[-1])
            inner = replace(ctx, loops=(*ctx.loops, stmt))
            self._stmts(stmt.body, inner, scope)
            self._stmts(stmt.orelse, ctx, scope)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            synced = False
            for item in stmt.items:
                self._expr(item.context_expr, ctx, scope)
                synced = synced or self._is_no_sync(item.context_expr, scope)
            self._stmts(stmt.body, replace(ctx, no_sync=ctx.no_sync or synced), scope)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            self._stmts(getattr(stmt, "body"), ctx, scope)  # noqa: B009 (TryStar: 3.11+)
            handlers: list[ast.ExceptHandler] = getattr(stmt, "handlers")  # noqa: B009
            for handler in handlers:
                if handler.type is not None:
                    self._expr(handler.type, ctx, scope)
                self._stmts(handler.body, replace(ctx, in_except=True), scope)
            self._stmts(getattr(stmt, "orelse"), ctx, scope)  # noqa: B009
            self._stmts(getattr(stmt, "finalbody"), ctx, scope)  # noqa: B009
        elif isinstance(stmt, ast.Match):
            self._expr(stmt.subject, ctx, scope)
            for case in stmt.cases:
                if case.guard is not None:
                    self._expr(case.guard, ctx, scope)
                self._stmts(case.body, ctx, scope)
        else:
            self._expr(stmt, ctx, scope)
            if ctx.guarded_here and isinstance(stmt, (ast.Assign, ast.AugAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    key = target.slice if isinstance(target, ast.Subscript) else None
                    if isinstance(key, ast.Constant) and key.value in ("lr", "learning_rate"):
                        self.add(target, "GT014", f"['{key.value}'] set")
        return ctx

    def _if(self, stmt: ast.If, ctx: _Ctx, scope: Scope) -> _Ctx:
        self._expr(stmt.test, ctx, scope)
        kind = self.facts.classify_guard(stmt.test, scope)
        if kind is None:
            self._stmts(stmt.body, ctx, scope)
            self._stmts(stmt.orelse, ctx, scope)
            if not stmt.orelse and _terminates(stmt.body) and self._creates_group(stmt.body):
                return replace(ctx, launcher=True)  # the ranks returned above; the parent goes on
            return ctx
        excused = self._collectives_in(stmt.body, scope) & self._collectives_in(stmt.orelse, scope)
        guarded = replace(ctx, rank_dep=True, guarded_here=True, excused=excused)
        body_ctx = replace(
            guarded,
            rank0=ctx.rank0 or kind == GUARD_RANK0,
            others=ctx.others or kind == GUARD_NOT_RANK0,
        )
        else_ctx = replace(
            guarded,
            rank0=ctx.rank0 or kind == GUARD_NOT_RANK0,
            others=ctx.others or kind == GUARD_RANK0,
        )
        self._stmts(stmt.body, body_ctx, scope)
        self._stmts(stmt.orelse, else_ctx, scope)
        if not stmt.orelse and _terminates(stmt.body):
            # `if not ctx.is_main_process: return`: what follows runs on the other ranks only
            return replace(else_ctx, excused=frozenset())
        return ctx

    # --- expressions and calls ------------------------------------------------------------

    def _expr(self, node: ast.AST, ctx: _Ctx, scope: Scope) -> None:
        cached = self._expr_cache.get(node)
        if cached is None:
            calls = [sub for sub in ast.walk(node) if isinstance(sub, ast.Call)]
            called = {id(c.func) for c in calls}
            refs = [
                func
                for sub in ast.walk(node)
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load)
                if id(sub) not in called
                for func in self.facts.functions.get(sub.id, [])
            ]
            cached = self._expr_cache[node] = (calls, refs)
        calls, refs = cached
        for call in calls:
            self._call(call, ctx, scope)
        for func in refs:  # a function passed as a value may be called from anywhere
            self.call_sites.setdefault(func, []).append(_Ctx())

    def _call(self, call: ast.Call, ctx: _Ctx, scope: Scope) -> None:
        for func in self.facts.local_functions(call):
            self.call_sites.setdefault(func, []).append(ctx)
        if not self.emit:
            return
        name = call_name(call, self.imports)
        tail = _tail(name)
        method = call.func.attr if isinstance(call.func, ast.Attribute) else None
        if tail == "DataParallel" and (name == tail or "torch" in name or "nn." in name):
            self.add(call, "GT001")
        if tail == "DataLoader":
            self._data_loader(call, scope)
        if name == "torch.save" or tail == "save_file":
            self._saved_wrapper(call, scope)
        if scope.node in self.dist_scopes and not ctx.rank0 and not ctx.launcher:
            self._write(call, name, tail, method, scope)
            if not ctx.in_except and not ctx.per_rank_block:
                self._log(call, name, tail, method, scope)
        if ctx.guarded_here:  # under a caller's guard only: reported at the call instead
            collective = self._collective(call, scope)
            if collective is not None and collective.split("(")[0] not in ctx.excused:
                side = "rank0" if ctx.rank0 else "others" if ctx.others else "some"
                self.guarded_collectives.append((call, collective, side, scope.node))
            self._rank_update(call, tail, method, scope)
        if self.data_parallel:
            self._optimizer_lr(call, name, tail, scope)
        if tail in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"):
            self._clip(call, scope)
        if (
            method == "backward"
            and not ctx.no_sync
            and ctx.loops
            and self.has_wrapper
            and self._accumulation_loop(ctx.loops[-1], scope)
        ):
            self.add(call, "GT013")
        if self.distributed:
            self._cuda_device(call, tail, method)

    # --- the rules, call by call ---------------------------------------------------------

    def _data_loader(self, call: ast.Call, scope: Scope) -> None:
        sampler = _arg(call, 3, "sampler")
        batch_sampler = _arg(call, 4, "batch_sampler")
        given = [s for s in (sampler, batch_sampler) if s is not None and not _is_const(s, None)]
        shuffle = _arg(call, 2, "shuffle")
        if given and _is_const(shuffle, True):
            assert shuffle is not None
            self.add(shuffle, "GT004")
        if not self.dist_setup or self._is_eval_loader(call):
            return
        for expr in given:
            kinds = self.facts.kinds(expr, scope)
            if "local_sampler" in kinds and "dist_sampler" not in kinds:
                self.add(expr, "GT003", "the sampler is not distributed")
        if not given:
            self.add(call, "GT003")

    def _is_eval_loader(self, call: ast.Call) -> bool:
        dataset = _kw(call, "dataset")
        names = [dotted(call.args[0]) if call.args else None]
        names.append(dotted(dataset) if dataset is not None else None)
        parent = self._assign_target(call)
        names.append(parent)
        if any(n is not None and _EVAL_NAME.search(_tail(n)) for n in names):
            return True
        # Handed to accelerate's prepare() or Fabric's setup_dataloaders(), which shard it.
        return any(
            isinstance(c.func, ast.Attribute)
            and c.func.attr.startswith(("prepare", "setup_dataloader"))
            and any(a is call or (parent is not None and dotted(a) == parent) for a in c.args)
            for c in self.all_calls
        )

    def _assign_target(self, call: ast.Call) -> str | None:
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is call:
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                return dotted(target)
        return None

    def _saved_wrapper(self, call: ast.Call, scope: Scope) -> None:
        obj = _arg(call, 0, "obj") if _tail(call_name(call, self.imports)) == "save" else None
        obj = obj if obj is not None else _arg(call, 0, "tensors")
        if obj is None:
            return
        if self.facts.kinds(obj, scope) & {"ddp", "dp"}:
            self.add(obj, "GT006", "the wrapper itself is pickled")
            return
        exprs: list[ast.AST] = [obj]
        if isinstance(obj, ast.Name):  # state = {...}; torch.save(state, path)
            exprs += [v for v in self.facts.lookup(obj.id, scope, _start(obj)) if v is not None]
        for expr in exprs:
            for node in ast.walk(expr):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "state_dict"
                    and self.facts.kinds(node.func.value, scope) & {"ddp", "dp"}
                ):
                    self.add(node, "GT006")

    def _write(
        self, call: ast.Call, name: str, tail: str, method: str | None, scope: Scope
    ) -> None:
        path: ast.expr | None = None
        what = tail
        if name == "torch.save":
            path = _arg(call, 1, "f")
        elif (tail == "save_file" and "safetensors" in name) or name == "save_file":
            path = _arg(call, 1, "filename")
        elif name in ("numpy.save", "numpy.savez", "numpy.savez_compressed", "numpy.savetxt"):
            path = _arg(call, 0, "file")
        elif name in ("open", "io.open") and name not in self.imports.names:
            mode = _arg(call, 1, "mode")
            text = mode.value if isinstance(mode, ast.Constant) else None
            if isinstance(text, str) and set(text) & set("wax+"):
                path = _arg(call, 0, "file")
        elif method in ("write_text", "write_bytes"):
            assert isinstance(call.func, ast.Attribute)
            path, what = call.func.value, method
        elif method in _FILE_METHODS:
            assert isinstance(call.func, ast.Attribute)
            path, what = (call.args[0] if call.args else call.func.value), method
        if path is None:
            return
        if self.facts.mentions_rank(call) or self.facts.kinds(path, scope) & {"tempfile"}:
            return  # one file per rank, or a private temporary file
        if dotted(path) == "os.devnull" or self.facts.kinds(path, scope) & {"buffer"}:
            return
        self.add(call, "GT007", what)

    def _log(self, call: ast.Call, name: str, tail: str, method: str | None, scope: Scope) -> None:
        what: str | None = None
        if isinstance(call.func, ast.Name) and call.func.id == "print":
            if "print" not in self.imports.names and _kw(call, "file") is None:
                what = "print"
        elif name == "logging.info" and not self.log_level_guarded:
            what = name
        elif method in _LOG_METHODS:
            assert isinstance(call.func, ast.Attribute)
            receiver = call.func.value
            is_logger = "logger" in self.facts.kinds(receiver, scope) or (
                _tail(dotted(receiver)).lower() in _LOGGER_NAMES
            )
            if is_logger and not self.log_level_guarded:
                what = f"logger.{method}"
        elif name.startswith(("wandb.", "mlflow.")) and tail.startswith(("log", "init")):
            what = name
        elif method in _BOARD_METHODS or tail == "SummaryWriter":
            what = method or tail
        elif tail in ("tqdm", "trange") and _kw(call, "disable") is None:
            what = tail
        if what is not None and not self.facts.mentions_rank(call):
            self.add(call, "GT008", what)

    def _collective(self, call: ast.Call, scope: Scope) -> str | None:
        direct = self._direct_collective(call, scope)
        if direct is not None:
            return direct
        for func in self.facts.local_functions(call):
            inner = self.collective_fns.get(func)
            if inner is not None:
                return f"{func.name}(), which calls {inner}"
        return None

    def _direct_collective(self, call: ast.Call, scope: Scope) -> str | None:
        name = call_name(call, self.imports)
        tail = _tail(name)
        head = name.split(".")[0]
        method = call.func.attr if isinstance(call.func, ast.Attribute) else None
        if tail in _COLLECTIVES and (
            name.startswith("torch.distributed") or head in ("dist", "distributed")
        ):
            return tail
        if method in ("barrier", "monitored_barrier", "wait_for_everyone"):
            return method
        if tail in _TOOLKIT_COLLECTIVES or (
            tail == "find_max_batch_size" and _kw(call, "ctx") is not None
        ):
            return tail
        if name.startswith("torch.distributed.checkpoint") and tail in ("save", "load"):
            return f"dcp.{tail}"
        if isinstance(call.func, ast.Attribute):
            kinds = self.facts.kinds(call.func.value, scope)
            if method in _CKPT_COLLECTIVE_METHODS and "ckpt_manager" in kinds:
                return f"CheckpointManager.{method}"
            if method == "state_dict" and "fsdp" in kinds:
                return "FSDP state_dict (all-gather)"
        return None

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
                name = self._direct_collective(call, scope)
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

    def _distributed_scopes(self) -> set[ast.AST]:
        """The scopes that run in every rank's process (where printing and writing count).

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
                name = call_name(sub, self.imports)
                tail = _tail(name)
                if tail in ("init_process_group", "init_distributed"):
                    creates.add(node)
                if (
                    tail in _DIST_SETUP
                    or tail in ("get_rank", "get_world_size")
                    or name.startswith("torch.distributed.")
                    or self._direct_collective(sub, scope) is not None
                ):
                    direct.add(node)
        changed = True
        while changed:  # callers of group creators
            changed = False
            for node, callees in calls.items():
                if node not in creates and callees & creates:
                    creates.add(node)
                    changed = True
        self.group_creators = creates
        found = direct | creates
        todo = list(found)
        while todo:  # callees of distributed code
            for callee in calls.get(todo.pop(), set()):
                if callee not in found:
                    found.add(callee)
                    todo.append(callee)
        return found

    def _creates_group(self, stmts: list[ast.stmt]) -> bool:
        """Whether ``stmts`` create the process group (directly or through this file's code)."""
        for node in iter_scope_nodes(stmts):
            if not isinstance(node, ast.Call):
                continue
            if _tail(call_name(node, self.imports)) in ("init_process_group", "init_distributed"):
                return True
            if any(f in self.group_creators for f in self.facts.local_functions(node)):
                return True
        return False

    def _collectives_in(self, stmts: list[ast.stmt], scope: Scope) -> frozenset[str]:
        if not stmts:
            return frozenset()
        key = id(stmts[0])
        cached = self._collectives_cache.get(key)
        if cached is not None:
            return cached
        names = set()
        for node in iter_scope_nodes(stmts):
            if isinstance(node, ast.Call):
                found = self._collective(node, scope)
                if found is not None:
                    names.add(found.split("(")[0])
        self._collectives_cache[key] = frozenset(names)
        return self._collectives_cache[key]

    def _rank_update(self, call: ast.Call, tail: str, method: str | None, scope: Scope) -> None:
        tokens = tail.lower().split("_")
        if ("lr" in tokens or ("learning" in tokens and "rate" in tokens)) and tokens[0] not in (
            "get",
            "print",
            "log",
            "show",
            "format",
        ):
            self.add(call, "GT014", f"{tail}()")
            return
        if method != "step":
            return
        assert isinstance(call.func, ast.Attribute)
        receiver = call.func.value
        kinds = self.facts.kinds(receiver, scope)
        label = _tail(dotted(receiver)).lower()
        if kinds & {"scheduler", "optimizer", "scaler", "amp_trainer"} or any(
            word in label for word in ("sched", "optim", "scaler")
        ):
            self.add(call, "GT014", f"{dotted(receiver) or 'optimizer'}.step()")

    def _optimizer_lr(self, call: ast.Call, name: str, tail: str, scope: Scope) -> None:
        is_optimizer = (
            name.startswith("torch.optim.") and "lr_scheduler" not in name and tail[:1].isupper()
        ) or (tail in _OPTIMIZERS and (name == tail or name.split(".")[0] in ("optim", "torch")))
        if not is_optimizer:
            return
        lr = _arg(call, 1, "lr")
        if lr is None:
            self.add(call, "GT010", "the default lr")
        elif self.facts.kinds(lr, scope) == {"number"}:
            self.add(lr, "GT010", ast.unparse(lr))

    def _clip(self, call: ast.Call, scope: Scope) -> None:
        info = self._scaler_scopes.get(scope.node)
        if info is None:
            return
        unscales = info
        if not any(pos < _start(call) for pos in unscales):
            self.add(call, "GT012")

    def _scaler_scope_info(self) -> dict[ast.AST, list[tuple[int, int]]]:
        """Scopes that use a GradScaler, with the positions of their ``unscale_`` calls."""
        info: dict[ast.AST, list[tuple[int, int]]] = {}
        for node, scope in self.facts.scopes.items():
            uses_scaler = False
            unscales = []
            for sub in self.facts.scope_nodes.get(node, []):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
                    receiver = sub.func.value
                    if sub.func.attr == "unscale_":
                        unscales.append(_start(sub))
                    elif sub.func.attr == "scale" and (
                        "scaler" in self.facts.kinds(receiver, scope)
                        or "scaler" in _tail(dotted(receiver)).lower()
                    ):
                        uses_scaler = True
            if uses_scaler:
                info[node] = unscales
        return info

    def _is_no_sync(self, expr: ast.expr, scope: Scope) -> bool:
        exprs: list[ast.AST] = [expr]
        if isinstance(expr, ast.Name):
            exprs += [v for v in self.facts.lookup(expr.id, scope, _start(expr)) if v is not None]
        for item in exprs:
            for node in ast.walk(item):
                if isinstance(node, ast.Call) and _tail(dotted(node.func)) in _NO_SYNC_CALLS:
                    return True
        return False

    def _accumulation_loop(self, loop: ast.stmt, scope: Scope) -> bool:
        cached = self._accum_cache.get(loop)
        if cached is not None:
            return cached
        result = False
        body = getattr(loop, "body", [])
        for node in iter_scope_nodes(body):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(_tail(dotted(t)) == "require_backward_grad_sync" for t in targets):
                    result = False  # nanoGPT's manual switch: the author handles the sync
                    break
            if isinstance(node, ast.If) and self._is_accumulation_test(node.test):
                for sub in iter_scope_nodes(node.body):
                    if self._is_optimizer_step(sub, scope):
                        result = True
        self._accum_cache[loop] = result
        return result

    def _is_accumulation_test(self, test: ast.expr) -> bool:
        for node in ast.walk(test):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
                return True
            if isinstance(node, ast.Call) and _tail(dotted(node.func)) == "should_step":
                return True
            name = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            if name is not None and ("accum" in name.lower() or "boundary" in name.lower()):
                return True
        return False

    def _is_optimizer_step(self, node: ast.AST, scope: Scope) -> bool:
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "step"
        ):
            return False
        receiver = node.func.value
        kinds = self.facts.kinds(receiver, scope)
        if kinds & {"optimizer", "scaler", "amp_trainer"}:
            return True
        label = _tail(dotted(receiver)).lower()
        return "sched" not in label and ("opt" in label or "scaler" in label)

    def _iterates_loader(self, expr: ast.expr, scope: Scope) -> bool:
        while (
            isinstance(expr, ast.Call)
            and expr.args
            and _tail(dotted(expr.func))
            in (
                "enumerate",
                "tqdm",
                "iter",
                "zip",
                "islice",
            )
        ):
            expr = expr.args[0]
        if "loader" in self.facts.kinds(expr, scope):
            return True
        return "loader" in _tail(dotted(expr)).lower()

    def _cuda_device(self, call: ast.Call, tail: str, method: str | None) -> None:
        if method == "cuda" and not call.args and not call.keywords:
            self.default_cuda.append((call, ".cuda()"))
        candidates: list[ast.expr] = []
        if (method or tail) in ("device", "to", "load", "cuda"):
            candidates += [a for a in call.args if isinstance(a, ast.Constant)]
        candidates += [
            k.value for k in call.keywords if k.arg in ("device", "map_location", "device_type")
        ]
        for value in candidates:
            if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                continue
            if _CUDA_INDEX.match(value.value):
                self.add(value, "GT002", f"'{value.value}' is the same GPU on every rank")
            elif value.value == "cuda" and not (
                tail == "autocast" or _kw(call, "device_type") is value
            ):
                self.default_cuda.append((value, "'cuda'"))

    # --- whole-file rules -----------------------------------------------------------------

    def _file_level(self) -> None:
        inits = [
            c
            for c in self.all_calls
            if _tail(call_name(c, self.imports)) in ("init_process_group", "init_distributed")
        ]
        direct = [c for c in inits if _tail(call_name(c, self.imports)) == "init_process_group"]
        pinned = bool(self.tails & {"set_device", "init_distributed"}) or any(
            _kw(c, "device_id") is not None for c in direct
        )
        if direct and not pinned and self.default_cuda:
            node, what = self.default_cuda[0]
            self.add(node, "GT002", f"{what} without set_device")
        self._set_epoch()
        self._scaler_with_bf16()
        self._unpaired_collectives()
        trains = any(
            isinstance(c.func, ast.Attribute) and c.func.attr == "backward" for c in self.all_calls
        ) or bool(self.tails & {"train_one_epoch"})
        if inits and trains and not self.tails & {"destroy_process_group", "cleanup_distributed"}:
            self.add(inits[0], "GT015")

    def _unpaired_collectives(self) -> None:
        """GT009, except collectives that rank 0 and the other ranks reach in separate blocks.

        ``if rank != 0: dist.barrier()`` ... ``if rank == 0: dist.barrier()`` is the classic
        "rank 0 goes first" idiom (download, preprocess, then release the others): the two
        barriers meet. Same function, same collective, as many calls on each side: paired.
        """
        sides: dict[tuple[int, str], dict[str, int]] = {}
        for _, collective, side, where in self.guarded_collectives:
            key = (id(where), collective.split("(")[0])
            sides.setdefault(key, {"rank0": 0, "others": 0, "some": 0})[side] += 1
        for call, collective, side, where in self.guarded_collectives:
            count = sides[(id(where), collective.split("(")[0])]
            if side != "some" and count["rank0"] == count["others"]:
                continue
            self.add(call, "GT009", collective)

    def _set_epoch(self) -> None:
        shuffled = False
        for call in self.all_calls:
            tail = _tail(call_name(call, self.imports))
            if tail in ("DistributedSampler", "make_distributed_sampler", "GlobalBatchSampler"):
                index = {"DistributedSampler": 3, "make_distributed_sampler": 2}.get(tail, 99)
                shuffled = shuffled or not _is_const(_arg(call, index, "shuffle"), False)
        handled = self.tails & {"set_epoch", "train_one_epoch"}
        if shuffled and not handled:
            for loop in dict.fromkeys(self.epoch_loops):
                self.add(loop, "GT005")

    def _scaler_with_bf16(self) -> None:
        dtypes: set[str] = set()
        for call in self.all_calls:
            if _tail(call_name(call, self.imports)) != "autocast":
                continue
            dtype = _kw(call, "dtype")
            if (
                dtype is None
                and len(call.args) > 1
                and "torch.autocast" in call_name(call, self.imports)
            ):
                dtype = call.args[1]
            dtypes.add(self._dtype_name(dtype))
        if dtypes != {"bfloat16"}:
            return
        for call in self.all_calls:
            if _tail(call_name(call, self.imports)) in ("GradScaler", "ShardedGradScaler"):
                enabled = _kw(call, "enabled")
                if enabled is None or _is_const(enabled, True):
                    self.add(call, "GT011")

    def _dtype_name(self, expr: ast.expr | None) -> str:
        if expr is None:
            return "default"
        name = self.imports.resolve(dotted(expr))
        if isinstance(expr, ast.Name) and name == expr.id:
            values = [v for s in self.facts.scopes.values() for _, v in s.bindings.get(expr.id, [])]
            resolved = {self.imports.resolve(dotted(v)) for v in values if v is not None}
            if len(resolved) == 1:
                name = resolved.pop()
        tail = _tail(name)
        return {"half": "float16", "bf16": "bfloat16"}.get(tail, tail or "unknown")


def check_tree(tree: ast.Module) -> list[RawFinding]:
    """Every rule's findings in a parsed module, sorted by position.

    Args:
        tree: ``ast.parse`` of the file.

    Returns:
        The findings (before ``# noqa`` and ``--select`` filtering).
    """
    return _Checker(tree).run()
