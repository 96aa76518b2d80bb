"""The set-up rules of ``gpu-training lint``: how the model, the data, the optimizer and the
device are built, one call at a time.

Each rule here looks at one call and what its arguments are bound to, wherever the call is:

* ``GT001`` ``torch.nn.DataParallel`` in a script that trains;
* ``GT003`` a training ``DataLoader`` of a distributed script with no distributed sampler,
  ``GT004`` ``shuffle=True`` beside a sampler;
* ``GT006`` saving the DDP wrapper's ``state_dict()``;
* ``GT010`` a literal learning rate (hygiene);
* ``GT002`` a fixed ``cuda:N`` (and the bare ``cuda`` devices the whole-file check needs),
  ``GT018`` a GPU index taken from the global rank.

A sampler counts as distributed when any of its bindings is one (chosen in an ``if/else``),
when it comes from a helper of the project that returns one, or when it is not a known local
sampler (a project's own ``RASampler``); arguments hidden behind ``**kwargs`` are not guessed.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> tree = ast.parse("rank = int(os.environ['RANK'])\\ntorch.cuda.set_device(rank)\\n")
    >>> facts = ModuleFacts(tree)
    >>> global_rank_source(facts, tree.body[1].value.args[0], facts.module_scope)
    "rank = int(os.environ['RANK']) (line 1)"
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from gpu_training.diagnostics.lint.calls import (
    call_arg,
    is_const,
    keyword_arg,
    node_start,
    parameter_index,
    tail,
)
from gpu_training.diagnostics.lint.group_rank import literal_group_rank
from gpu_training.diagnostics.lint.helper_loaders import always_none
from gpu_training.diagnostics.lint.inference import infers_only
from gpu_training.diagnostics.lint.launcher_branches import in_unlaunched_branch
from gpu_training.diagnostics.lint.loader_names import mapping_key, unpacked_loader_name
from gpu_training.diagnostics.lint.loaders import feeds_training, own_loader_class
from gpu_training.diagnostics.lint.locality import guard_locality
from gpu_training.diagnostics.lint.lone_callers import called_only_alone
from gpu_training.diagnostics.lint.mode_choices import named_mode_beside_ddp
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.rank_equal import equal_sides, fstring_values
from gpu_training.diagnostics.lint.returned_state import returned_and_saved
from gpu_training.diagnostics.lint.saved_wrappers import is_ddp_wrapper, saved_where_unwrapped
from gpu_training.diagnostics.lint.sharded_datasets import dataset_shards_itself
from gpu_training.diagnostics.lint.single_gpu import one_gpu_per_process
from gpu_training.diagnostics.lint.smoke_tests import main_block_smoke_test
from gpu_training.diagnostics.lint.splatted import splatted_keywords
from gpu_training.diagnostics.lint.state_saves import passed_at, state_dict_calls, unwrapped_here
from gpu_training.diagnostics.lint.unread import places_nothing

__all__ = ["EVAL_NAME", "SetupRules", "global_rank_source"]

Report = Callable[[ast.AST, str, str], None]
"""``report(node, code, detail)``."""

_OPTIMIZERS = frozenset(("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax"))
_OPTIMIZERS |= {"NAdam", "RAdam", "SparseAdam", "LBFGS", "Lion", "Adafactor"}
EVAL_NAME = re.compile(r"val|eval|test|dev", re.I)
"""A name that says validation, evaluation or test data (a loader no training step reads)."""
_DEVICE_ID_TAKERS = frozenset({"FullyShardedDataParallel", "FSDP"})  # their device_id= is a GPU
_CUDA_INDEX = re.compile(r"^cuda:\d+$")
_GLOBAL_RANK_ENV = frozenset({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})


class SetupRules:
    """The set-up rules for one file.

    Args:
        facts: The file's facts.
        calls: Every call of the file.
        report: Where findings go.
        dist_setup: The file sets up distributed data parallelism itself (``GT003``).
        data_parallel: The file wraps a model or shards data (``GT010``).
        distributed: The file runs under a process group (``GT002``, ``GT018``).
        trains: The file (or a helper it calls) runs a training step (``GT001`` is not
            reported in a file that only evaluates under ``torch.no_grad()``).
    """

    def __init__(
        self,
        facts: ModuleFacts,
        calls: list[ast.Call],
        report: Report,
        *,
        dist_setup: bool,
        data_parallel: bool,
        distributed: bool,
        trains: bool,
    ) -> None:
        self.facts = facts
        self.calls = calls
        self.report = report
        self.dist_setup = dist_setup
        self.data_parallel = data_parallel
        self.distributed = distributed
        self.trains = trains
        self.default_cuda: list[tuple[ast.AST, str]] = []
        self.alone: set[int] = set()  # ids of the calls checked on a one-process path
        """Bare ``.cuda()`` and ``'cuda'`` devices, for ``GT002`` without ``set_device``."""
        self._targets: dict[int, str | None] | None = None

    def check(self, call: ast.Call, scope: Scope, *, one_process: bool = False) -> None:
        """Run every set-up rule on one call (``one_process``: in a branch that runs without
        a process group, the ``else:`` of ``if world_size > 1:``)."""
        self.alone |= {id(call)} if one_process else set()
        name = call_name(call, self.facts.imports)
        last = tail(name)
        method = call.func.attr if isinstance(call.func, ast.Attribute) else None
        is_dp = last == "DataParallel" and (name == last or "torch" in name or "nn." in name)
        if (
            is_dp
            and not self._evaluates_only()
            and not main_block_smoke_test(self.facts.tree, call, trains=self.trains)
            and not infers_only(self.facts, call, scope)
            and not in_unlaunched_branch(scope.node, call)
            and not named_mode_beside_ddp(scope.node, call)
        ):
            self.report(call, "GT001", "one process, one thread per GPU")
        if last == "DataLoader" and not own_loader_class(self.facts, call):
            self._data_loader(call, scope, one_process)
        elif self.dist_setup and not one_process:
            self._helper_loader(call, scope)
        if method == "state_dict":
            self._returned_wrapper_state(call, scope)
        if name == "torch.save" or last == "save_file":
            self._saved_wrapper(call, scope)
        else:
            refs = self.facts.callees(call) if self.facts.resolver is not None else []
            for ref, summary in zip(refs, self.facts.summaries(call), strict=True):
                func = ref[1]
                for state in summary.saves_state_of:  # save_model(net): net.state_dict() saved
                    given = passed_at(call, func, state)
                    if given is not None and not saved_where_unwrapped(
                        self.facts, scope, call, ref, state, given
                    ):
                        self._saved_helper_state(given, summary.where, scope)
                index = summary.saves_argument  # save_checkpoint({...}, filename)
                if index is not None and (given := passed_at(call, func, index)) is not None:
                    self._saved_object(given, scope)
                    break
        if self.data_parallel:
            self._optimizer_lr(call, name, last, scope)
        if self.distributed and not one_process:  # a one-process path picks its own GPU
            # one process per machine, or one visible GPU (one process): its cuda:0
            if not (literal_group_rank(self.facts) or one_gpu_per_process(self.facts)):
                self._cuda_device(call, last, method, scope)
            self._device_from_rank(call, name, last, method, scope)

    def _evaluates_only(self) -> bool:
        """No training step anywhere, and the file runs under ``torch.no_grad()`` (or
        ``inference_mode()``): DataParallel for inference has no gradients to reduce."""
        if self.trains:
            return False
        return any(
            tail(call_name(c, self.facts.imports)) in ("no_grad", "inference_mode")
            for c in self.calls
        )

    # --- data -----------------------------------------------------------------------------

    def _data_loader(self, call: ast.Call, scope: Scope, one_process: bool) -> None:
        splatted = splatted_keywords(self.facts, call, scope)  # `**train_kwargs` read in sight
        spread = splatted or {}
        sampler = call_arg(call, 3, "sampler") or spread.get("sampler")
        batch_sampler = call_arg(call, 4, "batch_sampler") or spread.get("batch_sampler")
        given = [s for s in (sampler, batch_sampler) if s is not None and not is_const(s, None)]
        shuffle = call_arg(call, 2, "shuffle") or spread.get("shuffle")
        # `sampler = None; DataLoader(..., shuffle=True, sampler=sampler)` is valid
        if is_const(shuffle, True) and any(not always_none(self.facts, s, scope) for s in given):
            assert shuffle is not None
            if call_arg(call, 2, "shuffle") is None:  # from `**kwargs`: at the loader itself
                self.report(call, "GT004", f"shuffle=True (line {shuffle.lineno}) and a sampler")
            else:
                self.report(shuffle, "GT004", "shuffle=True and a sampler")
        if not self.dist_setup or one_process or self._is_eval_loader(call):
            return
        if called_only_alone(self.facts, scope):  # only a one-process script builds it
            return
        if (splatted is None and any(k.arg is None for k in call.keywords)) or any(
            isinstance(a, ast.Starred) for a in call.args
        ):
            return  # `DataLoader(dataset, **loader_kwargs)`: the sampler may be in there
        if self._alternative_of_sharded(call, scope):
            return
        target = self._assign_target(call)
        if not feeds_training(self.facts, call, scope, target, file_trains=self.trains):
            return  # every rank reads the same batches, and no training step reads them
        for expr in given:
            kinds = self._all_kinds(expr, scope)
            if "local_sampler" in kinds and "dist_sampler" not in kinds:
                what = ast.unparse(expr)
                self.report(expr, "GT003", f"sampler {what} is a local sampler on every path")
        if not given and not self._dataset_shards_itself(call, scope):
            self.report(call, "GT003", "no sampler= nor batch_sampler= in a distributed script")

    def _helper_loader(self, call: ast.Call, scope: Scope) -> None:
        """``GT003`` at a call of a project function that returns a loader with no sampler
        (``data_loader = create_dataloader(path, ...)``), when training reads it here."""
        helpers = [  # another module's: this file's own loaders are judged where they are built
            self.facts.resolver.summary(ref)
            for ref in self.facts.callees(call)
            if ref[0] is not self.facts and self.facts.resolver is not None
        ]
        helper = next((s.where for s in helpers if s.unsharded_loader), None)
        target = self._assign_target(call) or unpacked_loader_name(self.facts, call)
        if helper is None or self._is_eval_loader(call) or EVAL_NAME.search(target or ""):
            return
        if feeds_training(self.facts, call, scope, target, file_trains=self.trains):
            self.report(call, "GT003", f"{helper} builds its DataLoader with no sampler")

    def _alternative_of_sharded(self, call: ast.Call, scope: Scope) -> bool:
        """The name this loader is bound to is bound on another path to a loader with a
        distributed sampler (``if args.ddp == True: dl = DataLoader(d, sampler=Distributed
        Sampler(d))`` / ``else: dl = DataLoader(d, shuffle=True)``): the script's own path
        without a group, whatever its switch is called."""
        target = self._assign_target(call)
        if target is None:
            return False
        for other in self.facts.lookup_all(target, scope):
            if not isinstance(other, ast.Call) or other is call:
                continue
            if tail(call_name(other, self.facts.imports)) != "DataLoader":
                continue
            samplers = [call_arg(other, 3, "sampler"), call_arg(other, 4, "batch_sampler")]
            if any(s is not None and "dist_sampler" in self._all_kinds(s, scope) for s in samplers):
                return True
        return False

    def _all_kinds(self, expr: ast.expr, scope: Scope) -> frozenset[str]:
        """Kinds over every binding of a name (each branch of an ``if/else``)."""
        key = dotted(expr)
        if key is None:
            return self.facts.kinds(expr, scope)
        values = self.facts.lookup_all(key, scope)
        if not values:
            return self.facts.kinds(expr, scope)
        found: frozenset[str] = frozenset()
        for value in values:
            kinds = self.facts.kinds(value, scope) if value is not None else frozenset()
            found |= kinds if kinds else {"unknown"}
        return found

    def _dataset_shards_itself(self, call: ast.Call, scope: Scope) -> bool:
        """An ``IterableDataset`` (or a stream) has no sampler; it shards itself, or not."""
        dataset = call_arg(call, 0, "dataset")
        if dataset is None:
            return False
        values = [dataset]
        if isinstance(dataset, ast.Name):
            values += [v for v in self.facts.lookup_all(dataset.id, scope) if v is not None]
        if any("iterable" in ast.unparse(v).lower() for v in values):
            return True  # an IterableDataset: no sampler possible
        return dataset_shards_itself(self.facts, dataset, scope)

    def _is_eval_loader(self, call: ast.Call) -> bool:
        dataset = keyword_arg(call, "dataset")
        data = call.args[0] if call.args else dataset
        names = [dotted(data) if data is not None else None, mapping_key(self.facts, call, data)]
        names.append(dotted(dataset) if dataset is not None else None)
        parent = self._assign_target(call)
        names.append(parent)
        if any(n is not None and EVAL_NAME.search(tail(n)) for n in names):
            return True
        if any(_one_batch_of(c, call) for c in self.calls):
            return True  # `next(iter(DataLoader(ds, batch_size=1)))`: an example batch
        # Handed to accelerate's prepare() or Fabric's setup_dataloaders(), which shard it.
        return any(
            isinstance(c.func, ast.Attribute)
            and c.func.attr.startswith(("prepare", "setup_dataloader"))
            and any(a is call or (parent is not None and dotted(a) == parent) for a in c.args)
            for c in self.calls
        )

    def _assign_target(self, call: ast.Call) -> str | None:
        if self._targets is None:
            self._targets = {}
            for node in self.facts.nodes:
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                    self._targets[id(node.value)] = dotted(target)
        return self._targets.get(id(call))

    # --- checkpoints ----------------------------------------------------------------------

    def _saved_wrapper(self, call: ast.Call, scope: Scope) -> None:
        is_save = tail(call_name(call, self.facts.imports)) == "save"
        obj = call_arg(call, 0, "obj") if is_save else None
        obj = obj if obj is not None else call_arg(call, 0, "tensors")
        if obj is not None:
            self._saved_object(obj, scope)

    def _saved_object(self, obj: ast.expr, scope: Scope) -> None:
        """``GT006``: what ``torch.save`` (or a project helper that calls it) is given."""
        if isinstance(obj, ast.Starred):
            return
        if is_ddp_wrapper(self.facts, obj, scope):
            self.report(obj, "GT006", "the wrapper itself is pickled")
            return
        exprs: list[ast.AST] = [obj]
        if isinstance(obj, ast.Name):  # state = {...}; torch.save(state, path)
            lookup = self.facts.lookup(obj.id, scope, node_start(obj))
            exprs += [v for v in lookup if v is not None]
        for node in state_dict_calls(exprs):
            owner = node.func.value  # type: ignore[attr-defined]
            if is_ddp_wrapper(self.facts, owner, scope) and not unwrapped_here(
                self.facts, node, owner
            ):
                self.report(node, "GT006", f"{ast.unparse(owner)} is the DDP wrapper")

    def _returned_wrapper_state(self, call: ast.Call, scope: Scope) -> None:
        """``return {"model": ddp.state_dict()}`` in a function whose caller saves what it
        returns (:mod:`~gpu_training.diagnostics.lint.returned_state`)."""
        assert isinstance(call.func, ast.Attribute)
        owner = call.func.value
        if is_ddp_wrapper(self.facts, owner, scope):
            handed = returned_and_saved(self.facts, call, scope)
            if handed is not None:
                self.report(call, "GT006", f"{ast.unparse(owner)} is the DDP wrapper; {handed}")

    def _saved_helper_state(self, arg: ast.expr, helper: str, scope: Scope) -> None:
        if not isinstance(arg, ast.Starred) and is_ddp_wrapper(self.facts, arg, scope):
            detail = f"{helper} saves {ast.unparse(arg)}.state_dict(): the DDP wrapper"
            self.report(arg, "GT006", detail)

    # --- optimizer ------------------------------------------------------------------------

    def _optimizer_lr(self, call: ast.Call, name: str, last: str, scope: Scope) -> None:
        is_optimizer = (
            name.startswith("torch.optim.") and "lr_scheduler" not in name and last[:1].isupper()
        ) or (last in _OPTIMIZERS and (name == last or name.split(".")[0] in ("optim", "torch")))
        if not is_optimizer:
            return
        lr = call_arg(call, 1, "lr")
        if lr is None:
            self.report(call, "GT010", "the default lr")
        elif self.facts.kinds(lr, scope) == {"number"}:
            self.report(lr, "GT010", ast.unparse(lr))

    # --- devices --------------------------------------------------------------------------

    def _cuda_device(self, call: ast.Call, last: str, method: str | None, scope: Scope) -> None:
        if method == "cuda" and not call.args and not call.keywords:
            self.default_cuda.append((call, ".cuda()"))
        candidates: list[ast.expr] = []
        if last == "device" and len(call.args) == 2 and not isinstance(call.args[1], ast.Constant):
            return  # torch.device("cuda", local_rank): an index per rank, as set_device gives
        target = self._assign_target(call) if last == "device" else None
        if target is not None and places_nothing(self.facts, target, scope):
            return  # `self.device = torch.device("cuda:0")` that no line reads places nothing
        if (method or last) in ("device", "to", "load", "cuda"):
            for arg in call.args:  # `torch.device("cuda" if torch.cuda.is_available() else "cpu")`
                branches = [arg.body, arg.orelse] if isinstance(arg, ast.IfExp) else [arg]
                candidates += [b for b in branches if isinstance(b, ast.Constant)]
        candidates += [
            k.value for k in call.keywords if k.arg in ("device", "map_location", "device_type")
        ]
        for value in candidates:
            if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                continue
            if _CUDA_INDEX.match(value.value):
                self.report(value, "GT002", f"'{value.value}' is the same GPU on every rank")
            elif value.value == "cuda" and not (
                last == "autocast" or keyword_arg(call, "device_type") is value
            ):
                self.default_cuda.append((value, "'cuda'"))

    def _device_from_rank(
        self, call: ast.Call, name: str, last: str, method: str | None, scope: Scope
    ) -> None:
        indices: list[ast.expr] = []
        if (last == "set_device" and "cuda" in name) or last == "set_device_index":
            indices += call.args[:1]
        elif method in ("to", "cuda"):
            indices += call.args[:1] + [k.value for k in call.keywords if k.arg == "device"]
        elif last == "device" and (len(call.args) == 2 or name == "torch.cuda.device"):
            indices += call.args[-1:]  # torch.device("cuda", rank), torch.cuda.device(rank)
        elif last in ("DistributedDataParallel", "DDP"):
            ids = keyword_arg(call, "device_ids")
            if isinstance(ids, (ast.List, ast.Tuple)):
                indices += ids.elts
            output = keyword_arg(call, "output_device")
            indices += [output] if output is not None else []
        elif last in _DEVICE_ID_TAKERS and keyword_arg(call, "device_id") is not None:
            indices.append(keyword_arg(call, "device_id"))  # type: ignore[arg-type]
        for branch in [i for i in indices if isinstance(i, ast.IfExp)]:
            indices += [branch.body, branch.orelse]  # `"cpu" if low_memory else rank`
        for index in [v for i in indices for v in fstring_values(i)]:  # f"{device}:{rank}"
            evidence = global_rank_source(self.facts, index, scope) or self.equal_to_rank(
                index, scope
            )
            if evidence is not None:
                self.report(index, "GT018", evidence)

    def equal_to_rank(self, index: ast.expr, scope: Scope) -> str | None:
        """An index a branch's test makes equal to the global rank (``if dist.get_rank() ==
        i: shard.to(f"cuda:{i}")``): :mod:`~gpu_training.diagnostics.lint.rank_equal`."""
        if not isinstance(index, (ast.Name, ast.Attribute)):
            return None
        text = ast.unparse(index)
        if not any(  # the function's nodes, kept: no walk where no test compares the index
            isinstance(n, ast.Compare)
            and text in (ast.unparse(n.left), *map(ast.unparse, n.comparators))
            for n in self.facts.scope_nodes.get(scope.node, [])
        ):
            return None
        body = getattr(scope.node, "body", [])
        for side in equal_sides(body, index):
            source = global_rank_source(self.facts, side, scope)
            if source is not None:
                return f"{ast.unparse(index)} == {ast.unparse(side)} here: {source}"
        return None


def global_rank_source(
    facts: ModuleFacts, expr: ast.expr, scope: Scope, depth: int = 0
) -> str | None:
    """Where an expression takes the *global* rank from, if it plainly does.

    ``dist.get_rank()``, ``int(os.environ["RANK"])``, a project helper returning
    ``dist.get_rank()``, or a name bound only to one of those. A parameter named ``rank``
    proves nothing (``mp.spawn`` passes the local index), nor does ``rank % device_count()``.

    Args:
        facts: The file's facts.
        expr: The expression used as a device index.
        scope: Where it appears.
        depth: Recursion guard.

    Returns:
        The evidence (``"rank = int(os.environ['RANK']) (line 3)"``), or None.
    """
    if depth > 4:
        return None
    if isinstance(expr, ast.Call):
        last = tail(call_name(expr, facts.imports))
        if last == "int" and expr.args:
            return global_rank_source(facts, expr.args[0], scope, depth + 1)
        world = (dotted(expr.func) or "").endswith("COMM_WORLD.Get_rank")  # MPI
        if (last == "get_rank" or world) and not facts.callees(expr):  # MPI.COMM_WORLD's too
            return f"{ast.unparse(expr)} is the global rank"
        if any(s.rank_value == "global" for s in facts.summaries(expr)):
            return f"{ast.unparse(expr)} returns the global rank"
        if last in ("get", "getenv") and expr.args:
            return _env_rank(expr.args[0], expr)
        return None
    if isinstance(expr, ast.IfExp):  # `dist.get_rank() if distributed else 0`: 0 on one process
        sides = [s for s in (expr.body, expr.orelse) if not isinstance(s, ast.Constant)]
        return global_rank_source(facts, sides[0], scope, depth + 1) if len(sides) == 1 else None
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Mult)):
        # `node * gpus_per_node + local_rank` is a global rank; `rank % gpus` is not
        return global_rank_source(facts, expr.left, scope, depth + 1) or global_rank_source(
            facts, expr.right, scope, depth + 1
        )
    if isinstance(expr, ast.Subscript):
        base = facts.imports.resolve(dotted(expr.value))
        if base == "os.environ" or _environ_copy(facts, expr.value, scope):
            return _env_rank(expr.slice, expr)
        return None
    if isinstance(expr, (ast.Name, ast.Attribute)):
        key = dotted(expr)
        if key is None:
            return None
        values = facts.lookup_all(key, scope)
        if not values and getattr(expr, "attr", "") in ("process_index", "global_rank"):
            return f"{key} is the global rank"  # Accelerate's/HF's process_index, Lightning's
        if values and all(v is None for v in values) and isinstance(expr, ast.Name):
            return _unpacked_global_rank(facts, expr.id, scope, len(values)) or _passed_global_rank(
                facts, expr.id, scope, depth
            )
        if not values or any(v is None for v in values):
            return None
        sources = [global_rank_source(facts, v, scope, depth + 1) for v in values if v is not None]
        # bound on both sides of `if "SLURM_PROCID" in os.environ:`, the else being one node's
        both = any(sources) and guard_locality(facts, expr, scope) == "global"
        if sources and (all(sources) or both):
            value = next(v for v, found in zip(values, sources, strict=True) if found)
            assert value is not None
            return f"{key} = {ast.unparse(value)} (line {value.lineno})"
    return None


def _unpacked_global_rank(facts: ModuleFacts, name: str, scope: Scope, count: int) -> str | None:
    """``distributed, rank, world = setup()`` where the project's ``setup`` returns the global
    rank at that position; every one of the name's ``count`` bindings must be such an unpacking."""
    owner: Scope | None = scope
    while owner is not None and name not in owner.bindings:
        owner = owner.parent
    if owner is None:
        return None
    found: list[ast.Call] = []
    for node in facts.scope_nodes.get(owner.node, []):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        for target in node.targets:
            if not isinstance(target, (ast.Tuple, ast.List)):
                continue
            for index, item in enumerate(target.elts):
                if not (isinstance(item, ast.Name) and item.id == name):
                    continue
                summaries = facts.summaries(node.value)
                if not summaries or not all((index, "global") in s.rank_items for s in summaries):
                    return None
                found.append(node.value)
    if not found or len(found) != count:
        return None
    call = found[-1]
    return f"{name} from {ast.unparse(call)} (line {call.lineno}), which returns the global rank"


def _passed_global_rank(facts: ModuleFacts, name: str, scope: Scope, depth: int) -> str | None:
    """A parameter (``def train(args, rank):``) that every call in this file passes the global
    rank (``train(args, int(os.environ["RANK"]))``). The function must not be handed on as a
    value (``mp.spawn(train, ...)`` passes the local index), and must be called at least once."""
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    args = func.args
    if name not in [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]:
        return None
    loads = [
        n
        for n in facts.nodes  # the module's one walk, kept
        if isinstance(n, ast.Name) and n.id == func.name and isinstance(n.ctx, ast.Load)
    ]
    sites = facts.calls_of(func)
    if not sites or len(loads) != len(sites):
        return None  # referenced other than by a call: a spawn target or a callback
    index = parameter_index(func, name)
    found: list[str] = []
    for call, where in sites:
        value = call_arg(call, index, name)
        if value is None:
            return None
        source = global_rank_source(facts, value, where, depth + 1)
        if source is None:
            return None
        found.append(
            f"{func.name}() called with {ast.unparse(value)} (line {call.lineno}): {source}"
        )
    return found[0]


def _environ_copy(facts: ModuleFacts, expr: ast.expr, scope: Scope) -> bool:
    """A name bound only to a copy of the environment (``env = dict(os.environ)``,
    ``os.environ.copy()``, ``{k: os.environ[k] for k in ...}``)."""
    if not isinstance(expr, ast.Name):
        return False
    values = facts.lookup_all(expr.id, scope)
    return bool(values) and all(
        v is not None
        and any(
            facts.imports.resolve(dotted(n)) == "os.environ"
            for n in ast.walk(v)
            if isinstance(n, ast.Attribute)
        )
        for v in values
    )


def _env_rank(key: ast.expr, expr: ast.expr) -> str | None:
    if isinstance(key, ast.Constant) and key.value in _GLOBAL_RANK_ENV:
        return f"{ast.unparse(expr)} is the global rank"
    return None


def _one_batch_of(outer: ast.Call, loader: ast.Call) -> bool:
    """``next(iter(loader))``: one batch drawn and the loader dropped (an example batch to
    trace a pipeline with), not a loader trained over."""
    if not (isinstance(outer.func, ast.Name) and outer.func.id == "next" and outer.args):
        return False
    inner = outer.args[0]
    return (
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Name)
        and inner.func.id == "iter"
        and bool(inner.args)
        and inner.args[0] is loader
    )
