"""The checks behind ``gpu-training lint``: one AST walk per file finds every rule's pitfall.

The walk carries a context down the statements — does only rank 0 run this, or only some
ranks (``if rank == 0:``, the ``else`` of it, the rest of a function after
``if not ctx.is_main_process: return``)? is it inside ``no_sync()``? inside which loops? — and
hands every call to the rules. Functions of the file are followed: a function called only
under a rank-0 guard is rank-0 code, and one that runs a collective makes its call a
collective too (``if rank == 0: validate(model)`` where ``validate`` all-reduces).

This module holds the walk and the rules that look at one call alone — how the model, the
data, the optimizer and the device are set up (``GT001``-``GT004``, ``GT006``, ``GT010``) —
plus the whole-file rules run after it (``GT002`` without ``set_device``, ``GT015``). The
rules that need more than the call live beside it, each with the analysis it rests on:

* :mod:`~gpu_training.diagnostics.lint_ranks` — collectives and which scopes run on every rank:
  ``GT007`` writes and ``GT008`` logs from every rank, ``GT009`` collectives and ``GT014``
  updates under a rank guard;
* :mod:`~gpu_training.diagnostics.lint_training_loop` — accumulation loops, ``no_sync()``, the
  AMP scaler, epoch loops: ``GT005``, ``GT011``, ``GT012``, ``GT013``.

Rule texts live in :mod:`~gpu_training.diagnostics.lint_rules`; the facts about names,
imports and guards in :mod:`~gpu_training.diagnostics.lint_model`; how a call's arguments are
read in :mod:`~gpu_training.diagnostics.lint_calls`.

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

from gpu_training.diagnostics.lint_calls import call_arg, is_const, keyword_arg, node_start, tail
from gpu_training.diagnostics.lint_model import (
    GUARD_NOT_RANK0,
    GUARD_RANK0,
    ModuleFacts,
    Scope,
    call_name,
    dotted,
)
from gpu_training.diagnostics.lint_ranks import (
    DIST_SETUP_CALLS,
    GuardedCollective,
    RankAnalysis,
    every_rank_log,
    every_rank_write,
    logs_silenced_per_rank,
    rank_dependent_assignments,
    rank_dependent_update,
    unpaired_collectives,
)
from gpu_training.diagnostics.lint_training_loop import (
    LoopAnalysis,
    is_no_sync,
    iterates_loader,
    loops_without_set_epoch,
    scalers_with_bf16,
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

_WRAPPERS = frozenset(
    {"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "fully_shard"}
)
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
_EVAL_NAME = re.compile(r"val|eval|test|dev", re.I)
_CUDA_INDEX = re.compile(r"^cuda:\d+$")


def _terminates(body: list[ast.stmt]) -> bool:
    """Whether a block always leaves: return, raise, continue, break or sys.exit()."""
    last = body[-1] if body else None
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return tail(dotted(last.value.func)) in ("exit", "_exit", "abort")
    return False


class _Checker:
    def __init__(self, tree: ast.Module) -> None:
        self.facts = ModuleFacts(tree)
        self.imports = self.facts.imports
        self.tree = tree
        self.all_calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        self.tails = {tail(call_name(c, self.imports)) for c in self.all_calls}
        names = [call_name(c, self.imports) for c in self.all_calls]
        spawn = any("multiprocessing" in n and n.endswith("spawn") for n in names)
        self.dist_setup = bool(self.tails & DIST_SETUP_CALLS) or spawn
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
        self.ranks = RankAnalysis(self.facts, self.distributed)
        self.training_loop = LoopAnalysis(self.facts)
        self.epoch_loops: list[ast.stmt] = []
        self.guarded_collectives: list[GuardedCollective] = []
        # `logger.setLevel(INFO if is_main else WARN)`: the level already silences the others.
        self.log_level_guarded = logs_silenced_per_rank(self.all_calls, self.facts)
        self.default_cuda: list[tuple[ast.AST, str]] = []
        self._expr_cache: dict[ast.AST, tuple[list[ast.Call], list[_Func]]] = {}

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
            line, col = node_start(node)
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
            loader = not isinstance(stmt, ast.While) and iterates_loader(
                stmt.iter, scope, self.facts
            )
            if loader and ctx.loops and self.emit:
                self.epoch_loops.append(ctx.loops[-1])
            inner = replace(ctx, loops=(*ctx.loops, stmt))
            self._stmts(stmt.body, inner, scope)
            self._stmts(stmt.orelse, ctx, scope)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            synced = False
            for item in stmt.items:
                self._expr(item.context_expr, ctx, scope)
                synced = synced or is_no_sync(item.context_expr, scope, self.facts)
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
            if ctx.guarded_here:
                for target, detail in rank_dependent_assignments(stmt):
                    self.add(target, "GT014", detail)
        return ctx

    def _if(self, stmt: ast.If, ctx: _Ctx, scope: Scope) -> _Ctx:
        self._expr(stmt.test, ctx, scope)
        kind = self.facts.classify_guard(stmt.test, scope)
        if kind is None:
            self._stmts(stmt.body, ctx, scope)
            self._stmts(stmt.orelse, ctx, scope)
            if not stmt.orelse and _terminates(stmt.body) and self.ranks.creates_group(stmt.body):
                return replace(ctx, launcher=True)  # the ranks returned above; the parent goes on
            return ctx
        excused = self.ranks.collectives_in(stmt.body, scope) & self.ranks.collectives_in(
            stmt.orelse, scope
        )
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
        last = tail(name)
        method = call.func.attr if isinstance(call.func, ast.Attribute) else None
        if last == "DataParallel" and (name == last or "torch" in name or "nn." in name):
            self.add(call, "GT001")
        if last == "DataLoader":
            self._data_loader(call, scope)
        if name == "torch.save" or last == "save_file":
            self._saved_wrapper(call, scope)
        if scope.node in self.ranks.every_rank_scopes and not ctx.rank0 and not ctx.launcher:
            written = every_rank_write(call, scope, self.facts)
            if written is not None:
                self.add(call, "GT007", written)
            if not ctx.in_except and not ctx.per_rank_block:
                logged = every_rank_log(call, scope, self.facts, self.log_level_guarded)
                if logged is not None:
                    self.add(call, "GT008", logged)
        if ctx.guarded_here:  # under a caller's guard only: reported at the call instead
            collective = self.ranks.collective(call, scope)
            if collective is not None and collective.split("(")[0] not in ctx.excused:
                side = "rank0" if ctx.rank0 else "others" if ctx.others else "some"
                self.guarded_collectives.append(
                    GuardedCollective(call, collective, side, scope.node)
                )
            update = rank_dependent_update(call, scope, self.facts)
            if update is not None:
                self.add(call, "GT014", update)
        if self.data_parallel:
            self._optimizer_lr(call, name, last, scope)
        clips = last in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm")
        if clips and self.training_loop.clips_before_unscale(call, scope):
            self.add(call, "GT012")
        if (
            method == "backward"
            and not ctx.no_sync
            and ctx.loops
            and self.has_wrapper
            and self.training_loop.is_accumulation_loop(ctx.loops[-1], scope)
        ):
            self.add(call, "GT013")
        if self.distributed:
            self._cuda_device(call, last, method)

    # --- the rules, call by call ---------------------------------------------------------

    def _data_loader(self, call: ast.Call, scope: Scope) -> None:
        sampler = call_arg(call, 3, "sampler")
        batch_sampler = call_arg(call, 4, "batch_sampler")
        given = [s for s in (sampler, batch_sampler) if s is not None and not is_const(s, None)]
        shuffle = call_arg(call, 2, "shuffle")
        if given and is_const(shuffle, True):
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
        dataset = keyword_arg(call, "dataset")
        names = [dotted(call.args[0]) if call.args else None]
        names.append(dotted(dataset) if dataset is not None else None)
        parent = self._assign_target(call)
        names.append(parent)
        if any(n is not None and _EVAL_NAME.search(tail(n)) for n in names):
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
        obj = call_arg(call, 0, "obj") if tail(call_name(call, self.imports)) == "save" else None
        obj = obj if obj is not None else call_arg(call, 0, "tensors")
        if obj is None:
            return
        if self.facts.kinds(obj, scope) & {"ddp", "dp"}:
            self.add(obj, "GT006", "the wrapper itself is pickled")
            return
        exprs: list[ast.AST] = [obj]
        if isinstance(obj, ast.Name):  # state = {...}; torch.save(state, path)
            exprs += [v for v in self.facts.lookup(obj.id, scope, node_start(obj)) if v is not None]
        for expr in exprs:
            for node in ast.walk(expr):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "state_dict"
                    and self.facts.kinds(node.func.value, scope) & {"ddp", "dp"}
                ):
                    self.add(node, "GT006")

    def _optimizer_lr(self, call: ast.Call, name: str, last: str, scope: Scope) -> None:
        is_optimizer = (
            name.startswith("torch.optim.") and "lr_scheduler" not in name and last[:1].isupper()
        ) or (last in _OPTIMIZERS and (name == last or name.split(".")[0] in ("optim", "torch")))
        if not is_optimizer:
            return
        lr = call_arg(call, 1, "lr")
        if lr is None:
            self.add(call, "GT010", "the default lr")
        elif self.facts.kinds(lr, scope) == {"number"}:
            self.add(lr, "GT010", ast.unparse(lr))

    def _cuda_device(self, call: ast.Call, last: str, method: str | None) -> None:
        if method == "cuda" and not call.args and not call.keywords:
            self.default_cuda.append((call, ".cuda()"))
        candidates: list[ast.expr] = []
        if (method or last) in ("device", "to", "load", "cuda"):
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
                last == "autocast" or keyword_arg(call, "device_type") is value
            ):
                self.default_cuda.append((value, "'cuda'"))

    # --- whole-file rules -----------------------------------------------------------------

    def _file_level(self) -> None:
        inits = [
            c
            for c in self.all_calls
            if tail(call_name(c, self.imports)) in ("init_process_group", "init_distributed")
        ]
        direct = [c for c in inits if tail(call_name(c, self.imports)) == "init_process_group"]
        pinned = bool(self.tails & {"set_device", "init_distributed"}) or any(
            keyword_arg(c, "device_id") is not None for c in direct
        )
        if direct and not pinned and self.default_cuda:
            node, what = self.default_cuda[0]
            self.add(node, "GT002", f"{what} without set_device")
        for loop in loops_without_set_epoch(
            self.epoch_loops, self.all_calls, self.tails, self.imports
        ):
            self.add(loop, "GT005")
        for scaler in scalers_with_bf16(self.all_calls, self.facts):
            self.add(scaler, "GT011")
        for guarded in unpaired_collectives(self.guarded_collectives):
            self.add(guarded.call, "GT009", guarded.collective)
        trains = any(
            isinstance(c.func, ast.Attribute) and c.func.attr == "backward" for c in self.all_calls
        ) or bool(self.tails & {"train_one_epoch"})
        if inits and trains and not self.tails & {"destroy_process_group", "cleanup_distributed"}:
            self.add(inits[0], "GT015")


def check_tree(tree: ast.Module) -> list[RawFinding]:
    """Every rule's findings in a parsed module, sorted by position.

    Args:
        tree: ``ast.parse`` of the file.

    Returns:
        The findings (before ``# noqa`` and ``--select`` filtering).
    """
    return _Checker(tree).run()
