"""A Hugging Face ``Trainer`` script written to run in every process of a launch.

``TrainingArguments(..., local_rank=args.local_rank)`` or ``deepspeed=args.deepspeed``: the
script takes the launcher's rank or a DeepSpeed config, so ``torchrun``/``deepspeed`` starts
it once per GPU and every process runs it from the top. The ``Trainer`` guards its own saves
(``trainer.save_model``); the script's own writes (``model.save_pretrained(path)`` after
``trainer.train()``) run on every rank unless guarded (``trainer.is_world_process_zero()``).
The same holds for a script that reads a variable only a launcher sets (``LOCAL_RANK``), and
for one the repository's own shell scripts start with a launcher of one process per GPU
(``deepspeed src/train.py --deepspeed ds.json``, ``torchrun --nproc_per_node 8 train.py``),
whose training arguments come from ``HfArgumentParser`` or a ``TrainingArguments`` call, or
that is a copy of a script they so start (:mod:`~gpu_training.diagnostics.lint.launched_siblings`).
A script that does none of these is not taken as distributed (one GPU is the common case),
nor one that spreads its model over several GPUs in one process (``device_map="auto"``, a
map naming several devices, ``dispatch_model``), which DDP cannot train.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("from transformers import TrainingArguments, Trainer\\n"
    ...        "targs = TrainingArguments('out', local_rank=args.local_rank)\\n"
    ...        "trainer = Trainer(model=model, args=targs)\\ntrainer.train()\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> hf_every_process(facts) == {facts.tree}
    True
"""

from __future__ import annotations

import ast
import os

from gpu_training.diagnostics.lint.calls import keyword_arg, tail
from gpu_training.diagnostics.lint.collectives import UNDECIDED, literal
from gpu_training.diagnostics.lint.hf_trainers import PACKAGES, builds_arguments, builds_trainer
from gpu_training.diagnostics.lint.launched_siblings import launched_copy
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted
from gpu_training.diagnostics.lint.repo_files import multi_process_launches, repository_of

__all__ = ["hf_every_process", "saves_on_each_node", "written_for_a_launch"]

_LAUNCH_KEYWORDS = ("local_rank", "deepspeed")
_LAUNCHER_ENV = frozenset({"LOCAL_RANK", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE"})
_SPLIT_MAPS = frozenset({"auto", "balanced", "balanced_low_0", "sequential"})
_LAUNCH_ATTRS = frozenset({"local_rank", "world_size", "process_index", "local_process_index"})


def hf_every_process(facts: ModuleFacts) -> set[ast.AST]:
    """The scopes that build Hugging Face training arguments naming the launcher's rank or a
    DeepSpeed config, and train there: each runs in every process of the launch."""
    trains = {
        facts.scope_containing(c).node
        for c in facts.calls
        if isinstance(c.func, ast.Attribute) and c.func.attr == "train"
    }
    if _splits_model(facts, trains):
        return set()  # one process drives several GPUs: DDP cannot train such a model
    from_env = (
        _reads_launcher_env(facts)
        or _reads_launch_rank(facts)
        or _launched_by_repository(facts)
        or (facts.path not in ("", "<string>") and launched_copy(facts.path))  # a variant
    )
    seeds = {
        facts.scope_containing(c).node
        for c in facts.calls
        if (_launch_arguments(facts, c) or (from_env and _hf_arguments(facts, c)))
        and facts.scope_containing(c).node in trains
    }
    if from_env and not seeds:
        # `main()` parses the arguments and hands them to `train(args)`, which trains; or a
        # project helper builds them (`training_args = safe_training_args(...)`)
        seeds = {s for s in trains if _builds_trainer(facts, s)}
    return seeds


def written_for_a_launch(facts: ModuleFacts) -> bool:
    """The file reads a variable only a launcher sets, or the repository's shell scripts start
    it with a launcher of several processes: it runs once per GPU, whatever its code sets up."""
    cached = facts.memo.get("written-for-a-launch")
    if not isinstance(cached, bool):
        cached = _reads_launcher_env(facts) or _launched_by_repository(facts)
        facts.memo["written-for-a-launch"] = cached
    return cached


def _reads_launcher_env(facts: ModuleFacts) -> bool:
    """The file reads a variable only a launcher sets (``os.environ.get("WORLD_SIZE", 1)``,
    ``os.environ["LOCAL_RANK"]``): it is written to be started once per GPU by ``torchrun``
    or ``deepspeed``, and a Hugging Face ``Trainer`` in it runs in every process."""
    for node in facts.nodes:
        key: ast.expr | None = None
        if isinstance(node, ast.Subscript):
            key = node.slice if facts.imports.resolve(dotted(node.value)) == "os.environ" else None
        elif isinstance(node, ast.Call) and node.args:
            name = call_name(node, facts.imports)
            key = node.args[0] if name in ("os.environ.get", "os.getenv") else None
        if isinstance(key, ast.Constant) and key.value in _LAUNCHER_ENV:
            return True
    return False


def _splits_model(facts: ModuleFacts, trains: set[ast.AST]) -> bool:
    """The file spreads one model over several GPUs in one process: ``dispatch_model(...)``,
    or ``device_map=`` given ``"auto"``/``"balanced"``/``"sequential"`` or a dict naming two
    or more devices (not ``{"": local_rank}``, one GPU per process). A Trainer refuses to
    train such a model under DDP: the script runs as one process. Only where it trains
    (``trains``: the scopes calling ``.train()``), outside dead code (``if False:``)."""
    dead = {
        id(sub)
        for node in facts.nodes
        if isinstance(node, ast.If) and literal(node.test, {}) is not UNDECIDED
        for block in (
            [] if literal(node.test, {}) else node.body,
            node.orelse if literal(node.test, {}) else [],
        )
        for stmt in block
        for sub in ast.walk(stmt)
    }
    for call in facts.calls:
        if id(call) in dead or facts.scope_containing(call).node not in trains:
            continue
        if tail(call_name(call, facts.imports)) == "dispatch_model":
            return True
        value = keyword_arg(call, "device_map")
        if isinstance(value, ast.Name):
            bound = facts.lookup_all(value.id, facts.scope_containing(call))
            value = bound[0] if len(bound) == 1 else None
        if isinstance(value, ast.Constant) and value.value in _SPLIT_MAPS:
            return True
        if isinstance(value, ast.Dict):
            devices = {v.value for v in value.values if isinstance(v, ast.Constant)}
            if len(devices) >= 2:
                return True
    return False


def _reads_launch_rank(facts: ModuleFacts) -> bool:
    """The file reads the rank or world size its parsed training arguments took from the
    launcher (``training_args.local_rank``, ``.world_size``, ``.process_index``, also as its
    trainer's ``trainer.args.process_index``): it is written for a launch of several
    processes."""
    return any(
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Load)
        and node.attr in _LAUNCH_ATTRS
        and (
            (isinstance(node.value, ast.Name) and node.value.id in _parsed_arguments(facts))
            or _trainer_arguments(facts, node.value)  # `trainer.args.process_index`
        )
        for node in facts.nodes
    )


def _builds_trainer(facts: ModuleFacts, scope: ast.AST) -> bool:
    """The scope builds a Hugging Face trainer
    (:func:`~gpu_training.diagnostics.lint.hf_trainers.builds_trainer`)."""
    return any(
        facts.scope_containing(c).node is scope and builds_trainer(c, facts) for c in facts.calls
    )


def _trainer_arguments(facts: ModuleFacts, node: ast.expr) -> bool:
    """``trainer.args``: the training arguments of a name bound to a Hugging Face trainer."""
    if not (isinstance(node, ast.Attribute) and node.attr == "args"):
        return False
    owner = node.value
    if not isinstance(owner, ast.Name):
        return False
    values = facts.lookup_all(owner.id, facts.scope_containing(node))
    return bool(values) and all(
        isinstance(v, ast.Call) and builds_trainer(v, facts) for v in values
    )


def _parsed_arguments(facts: ModuleFacts) -> set[str]:
    """Names bound to what ``HfArgumentParser(...).parse_*()`` returns (tuples unpacked)."""
    names: set[str] = set()
    for node in facts.nodes:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if isinstance(func, ast.Attribute) and func.attr.startswith("parse_"):
            for target in node.targets:
                elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
                names.update(e.id for e in elts if isinstance(e, ast.Name))
    return names if any(_hf_arguments(facts, c) for c in facts.calls) else set()


def _launched_by_repository(facts: ModuleFacts) -> bool:
    """A shell script of the repository starts this file with ``torchrun``/``deepspeed``/
    ``accelerate launch`` (:func:`~gpu_training.diagnostics.lint.repo_files.multi_process_launches`)."""
    if facts.path in ("", "<string>"):
        return False
    path = os.path.abspath(facts.path)
    return os.path.basename(path) in multi_process_launches(repository_of(path))


def _hf_arguments(facts: ModuleFacts, call: ast.Call) -> bool:
    name = call_name(call, facts.imports)
    return builds_arguments(call, facts) or (
        name.split(".")[0] in PACKAGES and tail(name) == "HfArgumentParser"
    )


def _launch_arguments(facts: ModuleFacts, call: ast.Call) -> bool:
    if not builds_arguments(call, facts):
        return False
    given = [keyword_arg(call, k) for k in _LAUNCH_KEYWORDS]
    return any(v is not None and not isinstance(v, ast.Constant) for v in given)  # from the CLI


def saves_on_each_node(facts: ModuleFacts) -> list[ast.expr]:
    """Hugging Face training arguments with ``save_on_each_node=True`` (``GT017``): the
    ``Trainer`` then writes its checkpoints on the local main process of every node, each
    into the same ``output_dir``, instead of on the global main process alone. Returns the
    flags' ``True`` (where the finding goes)."""
    return [
        flag
        for c in facts.calls
        if builds_arguments(c, facts)
        and isinstance(flag := keyword_arg(c, "save_on_each_node"), ast.Constant)
        and flag.value is True
    ]
