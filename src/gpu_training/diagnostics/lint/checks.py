"""The checks behind ``gpu-training lint``: one AST walk per file finds every rule's pitfall.

The walk carries a context down the statements — does only rank 0 run this, or only some ranks
(``if rank == 0:``, the ``else`` of it, the rest of a function after ``if not
ctx.is_main_process: return``, ``x if rank == 0 else None``)? only local rank 0 of each node? is
it inside ``no_sync()``? inside which loops? in a block that ends the program? one process only?
— and hands every call to the rules. Functions are followed, in the file and across the project
(:class:`~gpu_training.diagnostics.lint.project.Project`): a function called only under a rank-0
guard is rank-0 code, whichever module calls it; one that runs a collective makes its call a
collective too; a helper that creates the process group makes its caller destroy it.

:func:`~gpu_training.diagnostics.lint.run.check_project` runs the files of a project
together. This module holds the walk (:class:`FileChecker`), which hands each call to the
rules; they live beside it, each with the analysis it rests on:

* :mod:`~gpu_training.diagnostics.lint.file_rules` — the whole-file rules, run once the walk
  is done: ``GT002`` without ``set_device``, ``GT005``, ``GT009``, ``GT011``, ``GT019`` and
  ``GT015`` (through :mod:`~gpu_training.diagnostics.lint.teardown`);
* :mod:`~gpu_training.diagnostics.lint.setup` — one call: GT001-GT004, GT006, GT010, GT018;
* :mod:`~gpu_training.diagnostics.lint.ranks` — collectives and which scopes run on every
  rank: ``GT007``/``GT017`` writes, ``GT008`` logs, ``GT009`` collectives and ``GT014``
  updates under a rank guard;
* :mod:`~gpu_training.diagnostics.lint.training_loop` — accumulation, ``no_sync()``, the AMP
  scaler, epoch loops: ``GT005``, ``GT011``-``GT013``, ``GT016``;
* :mod:`~gpu_training.diagnostics.lint.precision` — bf16 parameters under Adam: ``GT019``.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.project import Project
    >>> project = Project()
    >>> facts = project.add("t.py", ast.parse("import torch\\nm = torch.nn.DataParallel(m)\\n"))
    >>> checker = FileChecker(facts, project)
    >>> checker.settle()
    >>> [(f.code, f.line) for f in checker.report()]
    [('GT001', 2)]
"""

from __future__ import annotations

import ast
from dataclasses import replace

from gpu_training.diagnostics.lint.accumulation import every_micro_batch, every_step_call
from gpu_training.diagnostics.lint.all_but_one import all_but_one
from gpu_training.diagnostics.lint.borrowed_groups import group_from_helpers
from gpu_training.diagnostics.lint.bypassed_wrappers import bypasses_wrapper
from gpu_training.diagnostics.lint.callbacks import referenced_functions
from gpu_training.diagnostics.lint.caller_branches import branch_contexts, live_branches, note_site
from gpu_training.diagnostics.lint.calls import node_start, tail
from gpu_training.diagnostics.lint.collectives import DIST_SETUP_CALLS
from gpu_training.diagnostics.lint.context import (
    Ctx,
    RawFinding,
    ends_program,
    none_tested,
    terminates,
)
from gpu_training.diagnostics.lint.device_switch import one_process_side
from gpu_training.diagnostics.lint.disjunctions import remaining_disjuncts
from gpu_training.diagnostics.lint.epochs import (
    hands_loader_on,
    iterates_loader,
    unset_shuffling_sampler,
)
from gpu_training.diagnostics.lint.file_rules import whole_file_rules
from gpu_training.diagnostics.lint.frameworks import (
    fabric_launch,
    file_framework,
    one_process_fabric,
)
from gpu_training.diagnostics.lint.guards import (
    GUARD_NOT_RANK0,
    GUARD_RANK0,
    GUARD_RANK_DEP,
    classify_guard,
    guard_locality,
    rank_zero_decorator,
    single_process,
)
from gpu_training.diagnostics.lint.hf_launch import hf_every_process
from gpu_training.diagnostics.lint.lightning import lightning_launch
from gpu_training.diagnostics.lint.lone_callers import entry_or_alone
from gpu_training.diagnostics.lint.micro_batches import named_anywhere
from gpu_training.diagnostics.lint.mode_branches import groupless_side
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.node_writes import node_local_write, several_processes
from gpu_training.diagnostics.lint.one_rank import single_rank
from gpu_training.diagnostics.lint.paired_collectives import GuardedCollective, pairing_scope
from gpu_training.diagnostics.lint.plain_launches import launched_alone
from gpu_training.diagnostics.lint.project import Project
from gpu_training.diagnostics.lint.rank0_first import rank0_first
from gpu_training.diagnostics.lint.ranks import (
    RankAnalysis,
    every_rank_log,
    every_rank_write,
    logs_silenced_per_rank,
    rank_dependent_assignments,
    rank_dependent_update,
)
from gpu_training.diagnostics.lint.released import released_sides, releasing
from gpu_training.diagnostics.lint.setup import SetupRules
from gpu_training.diagnostics.lint.summary import FuncRef
from gpu_training.diagnostics.lint.trainer_callbacks import hook_methods
from gpu_training.diagnostics.lint.training_loop import LoopAnalysis, is_no_sync
from gpu_training.diagnostics.lint.wrappers import wrapper_kinds

__all__ = ["FileChecker"]


_Func = ast.FunctionDef | ast.AsyncFunctionDef
BASE_INHERITED = ("distributed", "unset_sampler")
"""What a subclass's file takes from the module of its base class: the process group and the
shuffling sampler that never gets set_epoch (the loader the base class hands its epoch loop)."""

_INHERITED = (
    "distributed",
    "has_wrapper",
    "ddp_wrapper",
    "print_silenced",
    "log_level_guarded",
    "unset_sampler",
)


class FileChecker:
    """The walk of one file, with what its project tells about it.

    :func:`~gpu_training.diagnostics.lint.run.check_project` drives it: :meth:`inherit` from
    the files that import it, :meth:`settle` the functions' contexts (again once the call
    sites from other files are in :attr:`external_sites`), then :meth:`report`.

    Args:
        facts: The file's facts.
        project: Its project.
    """

    def __init__(self, facts: ModuleFacts, project: Project) -> None:
        self.facts, self.project, self.tree = facts, project, facts.tree
        self.imports = facts.imports
        self.all_calls = facts.calls
        self.tails = {tail(call_name(c, self.imports)) for c in self.all_calls}
        names = [call_name(c, self.imports) for c in self.all_calls]
        spawn = any("multiprocessing" in n and n.endswith("spawn") for n in names)
        self.framework = file_framework(self.tails, facts)
        if self.framework == "fabric" and one_process_fabric(facts, self.tails):
            self.framework = None
        self.callee_summaries = [  # what the project's helpers in other modules do
            project.summary(ref)
            for c in self.all_calls
            for ref in facts.callees(c)
            if ref[0] is not facts
        ]
        helper_setup = group_from_helpers(facts, project)  # not one another script's trainer
        deepspeed = any(n in ("deepspeed.initialize", "deepspeed.init_distributed") for n in names)
        self.dist_setup = bool(self.tails & DIST_SETUP_CALLS) or spawn or helper_setup or deepspeed
        # `dist.x()` with `dist` never imported nor bound: a snippet that assumes the import.
        bare_dist = "dist" not in self.imports.names and not any(
            "dist" in scope.bindings for scope in facts.scopes.values()
        )
        prefixes = ("torch.distributed.", "dist.") if bare_dist else ("torch.distributed.",)
        uses_dist = any(n.startswith(prefixes) for n in names)
        self.launch = lightning_launch(facts)  # Lightning re-runs the script in every process
        self.fabric = fabric_launch(facts)  # so does Fabric, from its launch()
        self.seeds: set[ast.AST] = set(self.launch.scopes) | hf_every_process(facts)
        self.distributed = self.dist_setup or uses_dist or bool(self.framework or self.seeds)
        if self.distributed and launched_alone(facts, spawn, self.callee_summaries):
            self.distributed, self.seeds = False, set()  # `python train.py`: one process
        self.has_wrapper, self.ddp_wrapper = wrapper_kinds(
            self.tails, self.framework, self.all_calls, facts
        )
        self.own_wrapper, self.alone = self.ddp_wrapper, not self.distributed  # not inherited
        self.data_parallel = self.has_wrapper or bool(
            self.tails & {"DistributedSampler", "make_distributed_sampler"}
        )
        self.trains = (
            any(
                isinstance(c.func, ast.Attribute) and c.func.attr in ("backward", "zero_grad")
                for c in self.all_calls
            )
            or "train_one_epoch" in self.tails
            or any(s.trains for s in self.callee_summaries)
        )
        self.print_silenced = any(s.silences_print for s in self.callee_summaries) or any(
            isinstance(n, ast.Assign)
            and any(
                self.imports.resolve(dotted(t)) in ("builtins.print", "sys.stdout")
                for t in n.targets
            )
            for n in facts.nodes
        )
        # `logger.setLevel(INFO if is_main else WARN)`: the level already silences the others.
        self.log_level_guarded = logs_silenced_per_rank(self.all_calls, facts) or any(
            s.rank_logging for s in self.callee_summaries
        )
        self.unset_sampler = unset_shuffling_sampler(
            self.all_calls, self.tails, self.imports, self.callee_summaries, facts.toplevel
        )
        self.ranks = RankAnalysis(facts, self.distributed, frozenset(self.seeds))
        self.training_loop = LoopAnalysis(facts)
        self.findings: set[RawFinding] = set()
        self.emit = False
        self.call_sites: dict[_Func, list[Ctx]] = {}
        self.external_sites: dict[int, list[tuple[Ctx, bool]]] = {}
        self.outgoing: list[tuple[FuncRef, Ctx, bool, ast.Call]] = []
        self.callback_sites: list[tuple[FuncRef, Ctx, bool]] = []  # handed on, not called
        self.patched: dict[int, tuple[ast.AST, str]] = {}  # stored over a method: run.py
        self.epoch_loops: list[ast.stmt] = []
        self.guarded_collectives: list[GuardedCollective] = []
        self._expr_cache: dict[ast.AST, tuple[list[ast.Call], list[FuncRef], list[FuncRef]]] = {}
        self._ifexp_cache: dict[ast.AST, list[ast.IfExp]] = {}
        self._negations: dict[ast.If, ast.UnaryOp] = {}  # kept: the guard cache keys by id
        self.entry: dict[_Func, Ctx] = {}
        self.setup = SetupRules(
            facts,
            self.all_calls,
            self.add,
            dist_setup=self.dist_setup and self.framework is None,
            data_parallel=self.data_parallel,
            distributed=self.distributed,
            trains=self.trains,
        )

    # --- project ----------------------------------------------------------------------------

    def inherit(self, importer: FileChecker, flags: tuple[str, ...] = _INHERITED) -> bool:
        """Take on what a file that imports this one sets up for the whole process (and its
        shuffling sampler that never gets set_epoch, which this file's epoch loops may read).
        ``flags``: which of those (:data:`BASE_INHERITED` from a base class's module)."""
        gained = [f for f in flags if getattr(importer, f) and not getattr(self, f)]
        for flag in gained:
            setattr(self, flag, True)
        self.setup.distributed = self.distributed
        return bool(gained)

    def rebuild_ranks(self) -> None:
        """Recompute which scopes run on every rank (after :meth:`inherit` or new seeds)."""
        self.ranks = RankAnalysis(self.facts, self.distributed, frozenset(self.seeds))

    def settle(self) -> None:
        """Walk to a fixpoint of the functions' entry contexts, without reporting."""
        functions = [node for node in self.facts.scopes if not isinstance(node, ast.Module)]
        if not self.distributed and not self.external_sites:
            # no rank in sight: every entry context is the default one
            self.entry = {
                f: Ctx()
                for f in functions
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
            return
        entry: dict[_Func, Ctx] = {
            f: self._entry_context(f)
            for f in functions
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        for _ in range(8):  # call-site contexts feed function entry contexts: to a fixpoint
            self.call_sites, self.outgoing, self.callback_sites = {}, [], []
            self._walk(entry)
            updated = {f: self._entry_context(f) for f in entry}
            if updated == entry:
                break
            entry = updated
        self.entry = entry

    def report(self) -> list[RawFinding]:
        """Walk once more, reporting, then run the whole-file rules."""
        self.emit = True
        self._walk(self.entry)
        whole_file_rules(self)
        self._expr_cache, self._ifexp_cache = {}, {}  # per expression: ~0.1 GB on diffusers
        return sorted(self.findings)

    def _walk(self, entry: dict[_Func, Ctx]) -> None:
        # what the last walk learnt about rank-0-only names is relearnt with the new contexts
        self.facts.assigned_under.clear()
        self.facts.guard_cache.clear()
        module = self.facts.module_scope
        top = self.tree
        self._stmts(
            top.body,
            Ctx(launcher=top in self.launch.scopes, prelaunch=top in self.fabric.scopes),
            module,
        )
        for func, ctx in entry.items():
            ctx = replace(ctx, launcher=ctx.launcher or func in self.launch.scopes)
            ctx = replace(ctx, prelaunch=ctx.prelaunch or func in self.fabric.scopes)
            self._stmts(func.body, ctx, self.facts.scope_of(func))

    def _entry_context(self, func: _Func) -> Ctx:
        decorator = rank_zero_decorator(func)
        if decorator is not None:  # `@rank_zero_only def dump(...)`: the body runs on rank 0
            local = "local" in decorator.lower()
            return Ctx(rank0=True, local_only=local, guard=f"@{decorator} (line {func.lineno})")
        external = [c for c, _ in self.external_sites.get(id(func), [])]
        return entry_or_alone(self.facts, func, self.call_sites.get(func, []) + external)

    def add(self, node: ast.AST, code: str, detail: str = "") -> None:
        if self.emit:
            line, col = node_start(node)
            self.findings.add(RawFinding(line, col, code, detail))

    # --- statements -----------------------------------------------------------------------

    def _stmts(self, stmts: list[ast.stmt], ctx: Ctx, scope: Scope, branch: bool = False) -> None:
        labelled = any(self._is_rank_print(s) for s in stmts)
        exits = ctx.exits or (branch and ends_program(stmts))
        for stmt in stmts:
            ctx = self._stmt(stmt, replace(ctx, per_rank_block=labelled, exits=exits), scope)
            if id(stmt) in self.launch.fits:  # Lightning's other ranks start in fit(): all run on
                ctx = replace(ctx, launcher=False)
            if id(stmt) in self.fabric.fits:  # the other ranks re-ran what came before
                ctx = replace(ctx, prelaunch=False)

    def _is_rank_print(self, stmt: ast.stmt) -> bool:
        return (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name)
            and stmt.value.func.id == "print"
            and self.facts.mentions_rank(stmt.value)
        )

    def _stmt(self, stmt: ast.stmt, ctx: Ctx, scope: Scope) -> Ctx:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for expr in [*stmt.decorator_list, *stmt.args.defaults, *stmt.args.kw_defaults]:
                if expr is not None:
                    self._expr(expr, ctx, scope)
        elif isinstance(stmt, ast.ClassDef):
            for expr in [*stmt.decorator_list, *stmt.bases]:
                self._expr(expr, ctx, scope)
            self._stmts(stmt.body, ctx, scope)
        elif isinstance(stmt, ast.If):
            return self._if(live_branches(stmt), ctx, scope)  # `if False:` is dead code
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            self._expr(stmt.iter if not isinstance(stmt, ast.While) else stmt.test, ctx, scope)
            loader = not isinstance(stmt, ast.While) and iterates_loader(
                stmt.iter, scope, self.facts
            )
            if loader and ctx.loops and self.emit:
                self.epoch_loops.append(ctx.loops[-1])
            if not loader and self.emit and hands_loader_on(self.facts, stmt, scope):
                self.epoch_loops.append(stmt)  # `for epoch ...: train_one_epoch(model, loader)`
            inner = replace(ctx, loops=(*ctx.loops, stmt))
            self._stmts(stmt.body, inner, scope)
            self._stmts(stmt.orelse, ctx, scope)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            synced = False
            for item in stmt.items:
                self._expr(item.context_expr, ctx, scope)
                if is_no_sync(item.context_expr, scope, self.facts):
                    synced = True
                    if self.emit and self.has_wrapper:
                        late = self.training_loop.no_sync_after_forward(stmt, item, scope)
                        if late is not None:
                            self.add(late[0], "GT016", late[1])
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
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                self._note_assignment(stmt, ctx, scope)
            if ctx.guarded_here:
                for target, detail in rank_dependent_assignments(stmt, scope):
                    self.add(target, "GT014", detail)
        return ctx

    def _note_assignment(self, stmt: ast.Assign | ast.AnnAssign, ctx: Ctx, scope: Scope) -> None:
        """Record whether only rank 0 sets a name to something (for ``if x is not None``)."""
        value = stmt.value
        if isinstance(value, ast.Constant) and value.value is None:
            return
        targets = list(stmt.targets) if isinstance(stmt, ast.Assign) else [stmt.target]
        for target in list(targets):  # a copy: the statement's own list stays as parsed
            if isinstance(target, (ast.Tuple, ast.List)):  # best, epoch = saver.save(...)
                targets += target.elts
        for target in targets:
            key = dotted(target)
            if key is not None:
                owner = self.facts.binding_owner(key, scope)
                under = self.facts.assigned_under.setdefault((owner, key), set())
                under.add(ctx.rank0)
                if isinstance(value, ast.Constant) and isinstance(value.value, bool):
                    others = ctx.others or ctx.all_but_one
                    ranks = "rank0" if ctx.rank0 else "others" if others else "all"
                    under.add(f"{value.value}:{ranks}")  # `save = True` ... `save = False`

    def _guarded(self, ctx: Ctx, kind: str, test: ast.expr, scope: Scope) -> tuple[Ctx, Ctx]:
        """The contexts of the two branches of a rank-dependent test."""
        local = guard_locality(self.facts, test, scope) == "local"
        text = f"{ast.unparse(test)} (line {test.lineno})"
        guarded = replace(ctx, rank_dep=True, guarded_here=True)

        def rank0_side(outer: Ctx) -> Ctx:
            local_only = (outer.local_only if outer.rank0 else True) and local
            return replace(outer, rank0=True, local_only=local_only, guard=text)

        body = rank0_side(guarded) if kind == GUARD_RANK0 else guarded
        orelse = rank0_side(guarded) if kind == GUARD_NOT_RANK0 else guarded
        body = replace(body, others=ctx.others or kind == GUARD_NOT_RANK0)
        orelse = replace(orelse, others=ctx.others or kind == GUARD_RANK0)
        return body, orelse

    def _if(self, stmt: ast.If, ctx: Ctx, scope: Scope) -> Ctx:
        self._expr(stmt.test, ctx, scope)
        kind = classify_guard(self.facts, stmt.test, scope)
        optional = replace(ctx, optional=ctx.optional | none_tested(stmt.test))
        rest = remaining_disjuncts(ctx.disjunctions, stmt.test)
        if (
            kind is None
            and rest is not None
            and classify_guard(self.facts, rest, scope) == GUARD_RANK0
        ):
            body_ctx = self._guarded(optional, GUARD_RANK0, rest, scope)[0]
            self._stmts(stmt.body, body_ctx, scope, branch=True)
            self._stmts(stmt.orelse, ctx, scope, branch=True)
            return ctx
        if kind is None and isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.Or):
            optional = replace(optional, disjunctions=(*ctx.disjunctions, stmt.test))
        if kind is None:
            single = replace(optional, rank0=True, local_only=False, guard="one process")
            negated = self._negations.setdefault(stmt, ast.UnaryOp(op=ast.Not(), operand=stmt.test))
            side = one_process_side(self.facts, stmt, scope, self.alone)  # `.to("cuda:0")`
            side = side or groupless_side(self.ranks, stmt, scope)  # `if args.merge: merge()`
            lone_body = side == "body" or single_process(self.facts, stmt.test, scope)
            lone_else = not lone_body and (
                side == "else" or single_process(self.facts, negated, scope)
            )
            # `if args.distributed: ... else: print(...)`: the else runs without ranks
            body_ctx, else_ctx = branch_contexts(self, stmt, scope, optional, ctx)  # by callers
            body_ctx, else_ctx = released_sides(self.facts, scope, stmt, body_ctx, else_ctx)
            self._stmts(stmt.body, single if lone_body else body_ctx, scope, branch=True)
            self._stmts(
                stmt.orelse,
                replace(single, optional=ctx.optional) if lone_else else else_ctx,
                scope,
                branch=True,
            )
            if not stmt.orelse and terminates(stmt.body) and self.ranks.creates_group(stmt.body):
                return replace(ctx, launcher=True)  # the ranks returned above; the parent goes on
            if not stmt.orelse and terminates(stmt.body):  # `if x: return`, `if world > 1: raise`
                return replace(single, optional=ctx.optional) if lone_else else else_ctx
            return ctx
        excused = self.ranks.collectives_in(stmt.body, scope) & self.ranks.collectives_in(
            stmt.orelse, scope
        )
        body_ctx, else_ctx = self._guarded(
            replace(optional, excused=excused), kind, stmt.test, scope
        )
        else_ctx = replace(else_ctx, optional=ctx.optional)
        if kind == GUARD_RANK_DEP and single_rank(self.facts, stmt.test, scope):
            body_ctx = replace(body_ctx, one_rank=True)  # `if rank == 1:`: one process
        elif kind == GUARD_RANK_DEP and all_but_one(self.facts, stmt.test, scope):
            body_ctx, else_ctx = (
                replace(body_ctx, all_but_one=True),
                replace(else_ctx, one_rank=True),
            )
        self._stmts(stmt.body, body_ctx, scope, branch=True)
        self._stmts(stmt.orelse, else_ctx, scope, branch=True)
        if not stmt.orelse and terminates(stmt.body) and not isinstance(stmt.body[-1], ast.Raise):
            # `if not ctx.is_main_process: return`: the rest runs on the other ranks only (a raise
            after = replace(else_ctx, excused=frozenset(), exits=ctx.exits)  # fails the job)
            return releasing(self.facts, scope, stmt, ctx, after)
        return ctx

    # --- expressions and calls ------------------------------------------------------------

    def _expr(self, node: ast.AST, ctx: Ctx, scope: Scope) -> None:
        cached = self._expr_cache.get(node)
        if cached is None:  # one walk for the calls, the names and the conditionals in it
            subs = list(ast.walk(node))
            calls = [sub for sub in subs if isinstance(sub, ast.Call)]
            called = {id(c.func) for c in calls}
            refs = referenced_functions(self.facts, subs, called, self.patched)
            hooks = [  # `Trainer(callbacks=[SaveCallback()])`: its hooks run in the training
                ref
                for sub in subs
                if isinstance(sub, ast.Call)
                or (isinstance(sub, ast.Name) and id(sub) not in called)
                for ref in hook_methods(self.facts, sub)
            ]
            cached = self._expr_cache[node] = (calls, refs, hooks)
            self._ifexp_cache[node] = [sub for sub in subs if isinstance(sub, ast.IfExp)]
        calls, refs, hooks = cached
        overrides = self._conditional_calls(node, ctx, scope)
        for call in calls:
            self._call(call, overrides.get(id(call), ctx), scope)
        every_rank = scope.node in self.ranks.every_rank_scopes
        handed = [(ref, ctx, every_rank and not ctx.launcher) for ref in refs]
        # a hook runs inside the framework's training, in its processes, not the launcher's
        if hooks:
            trained = replace(ctx, launcher=False, prelaunch=False)
            handed += [(ref, trained, every_rank) for ref in hooks]
        for (owner, func), at, every in handed:
            site = replace(at, loops=(), no_sync=False)  # `mp.Process(target=f)` under a guard
            if owner is self.facts:
                self.call_sites.setdefault(func, []).append(site)
            else:  # a handler of another module: its registration is a site (callbacks.py)
                self.callback_sites.append(((owner, func), site, every))

    def _conditional_calls(self, node: ast.AST, ctx: Ctx, scope: Scope) -> dict[int, Ctx]:
        """``SummaryWriter() if rank == 0 else None``: the calls of each branch of a
        rank-dependent conditional expression run on those ranks only."""
        found: dict[int, Ctx] = {}
        for sub in self._ifexp_cache[node]:  # filled by _expr, its only caller
            kind = classify_guard(self.facts, sub.test, scope)
            if kind not in (GUARD_RANK0, GUARD_NOT_RANK0):
                continue
            body, orelse = self._guarded(ctx, kind, sub.test, scope)
            for branch, branch_ctx in ((sub.body, body), (sub.orelse, orelse)):
                for call in ast.walk(branch):
                    if isinstance(call, ast.Call):
                        found[id(call)] = branch_ctx
        return found

    def _call(self, call: ast.Call, ctx: Ctx, scope: Scope) -> None:
        every_rank = scope.node in self.ranks.every_rank_scopes and not ctx.launcher
        for callee_facts, func in self.facts.callees(call):
            if callee_facts is self.facts:
                note_site(self, func, call, ctx)  # its arguments too: caller_branches
            else:
                self.outgoing.append(((callee_facts, func), ctx, every_rank, call))
        if not self.emit:
            return
        method = call.func.attr if isinstance(call.func, ast.Attribute) else None
        self.setup.check(call, scope, one_process=ctx.guard == "one process")
        if every_rank or several_processes(call, ctx, scope, self.facts):
            self._rank_rules(call, ctx, scope)
        if ctx.guarded_here:  # under a caller's guard only: reported at the call instead
            collective = self.ranks.collective(call, scope)
            if collective is not None and collective.split("(")[0] not in ctx.excused:
                side = "rank0" if ctx.rank0 else "others" if ctx.others else "some"
                self.guarded_collectives.append(
                    GuardedCollective(call, collective, side, pairing_scope(scope.node, scope.cls))
                )
            update = rank_dependent_update(call, scope, self.facts)
            if update is not None:
                self.add(call, "GT014", update)
        last = tail(call_name(call, self.imports))
        clips = last in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm")
        if clips and self.training_loop.clips_before_unscale(call, scope):
            self.add(call, "GT012", "the scaler's scale() comes first and no unscale_() before")
        if self.ddp_wrapper and not ctx.no_sync and ctx.guard != "one process":  # no all-reduce
            if not (self.own_wrapper or named_anywhere(self.facts, scope.node)):
                pass  # a helper nobody calls: no importer's model reaches it
            elif ctx.loops and not bypasses_wrapper(self.facts, call, scope):  # no all-reduce
                every_micro_batch(self, call, ctx, scope, method)
            elif method == "backward" and isinstance(scope.node, _Func):
                every_step_call(self, call, scope)

    def _rank_rules(self, call: ast.Call, ctx: Ctx, scope: Scope) -> None:
        """``GT007``/``GT017`` writes and ``GT008`` logs of code every rank runs."""
        written = every_rank_write(call, scope, self.facts)
        if written is not None and any(
            classify_guard(self.facts, k.value, scope) == GUARD_RANK0 for k in call.keywords
        ):
            written = None  # save_pretrained(..., is_main_process=accelerator.is_main_process)
        if (
            written is not None
            and "download" in written
            and (ctx.prelaunch or rank0_first(self.facts, call, scope))
        ):
            written = None  # made by one process alone; the others find it there
        if written is not None and not (ctx.rank0 or ctx.one_rank):
            hints = {"accelerate": "; accelerator.save() writes once", "fabric": "; fabric.save()"}
            hint = "" if "download" in written else hints.get(self.framework or "", "")
            self.add(call, "GT007", f"{written} runs on every rank: no rank-0 guard{hint}")
        elif (node := node_local_write(call, ctx, scope, self.facts, written)) is not None:
            self.add(call, "GT017", f"{node} under {ctx.guard}: local rank 0 of every node")
        if ctx.rank0 or ctx.one_rank or ctx.in_except or ctx.per_rank_block or ctx.exits:
            return
        logged = every_rank_log(call, scope, self.facts, self.log_level_guarded)
        if logged is None:
            return
        owner = call.func.value if isinstance(call.func, ast.Attribute) else None
        receiver = dotted(owner) if owner is not None else None
        if receiver is not None and (
            receiver in ctx.optional or "rank_logger" in self.facts.kinds(owner, scope)
        ):
            return  # `if writer is not None:`; a logger whose handlers are chosen by rank
        if logged == "print" and self.print_silenced:
            return  # the project replaced builtins.print on the other ranks
        helper = {"accelerate": "accelerator.print", "fabric": "fabric.print"}.get(
            self.framework or ""
        )
        why = f"use {helper}" if helper and logged == "print" else "no rank-0 guard"
        self.add(call, "GT008", f"{logged}: {why}")
