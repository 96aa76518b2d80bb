"""Models whose parameters are sharded across the ranks, however they were wrapped.

A sharded model's forward, ``generate()``, ``state_dict()`` and ``save_pretrained()`` gather
the shards from every rank (``GT009`` when only some ranks call them). A model is sharded
when the code says so in one of these ways:

* bound to ``FSDP(...)`` / ``FullyShardedDataParallel(...)`` / ``fully_shard(...)``, or passed
  to ``fully_shard`` (FSDP2 shards in place);
* handed to ``accelerator.prepare(...)`` (or Fabric's ``setup``) by a script whose
  Accelerator shards: built with ``fsdp_plugin=`` in the file, or launched with an Accelerate
  config of the repository whose every multi-process ``distributed_type`` is ``FSDP``;
* named as the model of an FSDP class method in the same function
  (``with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, ...):``,
  ``FSDP.optim_state_dict(model, optimizer)``): these take only FSDP modules, so a helper
  handed the model as a parameter still knows it is sharded;
* unwrapped from one of those (``model.module``, ``accelerator.unwrap_model(model)``) when the
  wrapper auto-wraps its layers (an ``auto_wrap_policy``, or Accelerate's FSDP, which wraps
  the transformer layers by default): the inner layers are FSDP units still, and their
  ``state_dict()`` hooks and forwards gather too.
* a parameter of a function of the file every call of which passes a sharded model there
  (``save_checkpoint(model, ...)`` after ``model = FSDP(...)``): the helper's
  ``model.state_dict()`` gathers the shards as the caller's would.

Which distributed type a repository's Accelerate configs use (:func:`accelerate_sharding`)
also decides whether Accelerate's ``load_state`` is a collective (it is under FSDP and
DeepSpeed, which load per-rank shards; under DDP each process loads the files alone).

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = "from accelerate import Accelerator, FullyShardedDataParallelPlugin\\n"
    >>> src += "acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())\\n"
    >>> src += "model, opt = acc.prepare(model, opt)\\n"
    >>> tree = ast.parse(src + "model(x)\\n")
    >>> facts = ModuleFacts(tree)
    >>> accelerate_sharding(facts)
    'fsdp'
    >>> sharded_model(tree.body[-1].value.func, facts.module_scope, facts)
    True
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Iterator

from gpu_training.diagnostics.lint.calls import keyword_arg, parameter_index, parents, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, call_name, dotted
from gpu_training.diagnostics.lint.repo_files import repository_of, text_files
from gpu_training.diagnostics.lint.state_saves import passed_at

__all__ = [
    "accelerate_sharding",
    "accelerate_unsharded",
    "names_checkpoints",
    "sharded_model",
    "shards_anything",
]

_FSDP_CALLS = frozenset({"FullyShardedDataParallel", "FSDP"})
_CONFIG_TYPE = re.compile(r"^distributed_type:\s*['\"]?([A-Za-z_]+)", re.MULTILINE)


def accelerate_sharding(facts: ModuleFacts) -> str | None:
    """How the file's Accelerator distributes the model: ``"fsdp"``, ``"deepspeed"``, or None
    (DDP, one process, or not known).

    An ``Accelerator(fsdp_plugin=...)`` / ``(deepspeed_plugin=...)`` in the file decides;
    otherwise the Accelerate configs of the repository (``distributed_type:`` in its YAML
    files), when every one that runs several processes names the same sharding type.
    """
    cached = facts.memo.get("accelerate-sharding")
    if isinstance(cached, tuple):
        return cached[0] if cached else None
    found: str | None = None
    uses_accelerator = False
    for call in facts.calls:
        if tail(call_name(call, facts.imports)) != "Accelerator":
            continue
        uses_accelerator = True
        for keyword, kind in (
            ("fsdp_plugin", "fsdp"),
            ("deepspeed_plugin", "deepspeed"),
            ("deepspeed_plugins", "deepspeed"),
        ):
            value = keyword_arg(call, keyword)
            if value is not None and not (isinstance(value, ast.Constant) and value.value is None):
                found = kind
    if found is None and uses_accelerator and facts.path not in ("", "<string>"):
        found = _repository_sharding(repository_of(os.path.abspath(facts.path)))
    facts.memo["accelerate-sharding"] = (found,) if found else ()
    return found


@functools.lru_cache(maxsize=64)
def _repository_sharding(root: str) -> str | None:
    """``"fsdp"``/``"deepspeed"`` when every Accelerate config under ``root`` that runs
    several processes names that type (``NO`` configs aside), else None."""
    kinds = _repository_types(root)
    if kinds == {"FSDP"}:
        return "fsdp"
    if kinds == {"DEEPSPEED"}:
        return "deepspeed"
    return None


@functools.lru_cache(maxsize=64)
def _repository_types(root: str) -> frozenset[str] | None:
    """The ``distributed_type`` values of the Accelerate configs under ``root``, ``NO``
    aside; with no Accelerate config at all, ``MULTI_GPU`` (Accelerate's default launch)
    when the repository names no sharding library, else None (not known)."""
    kinds: set[str] = set()
    configs = 0
    for _, text in text_files(root, (".yaml", ".yml")):
        match = _CONFIG_TYPE.search(text)
        if match is not None:
            configs += 1
            if match.group(1).upper() != "NO":
                kinds.add(match.group(1).upper())
    for _, text in text_files(root, (".sh", ".bash", ".slurm")):
        for kind in _launched_types(text):
            configs += 1
            kinds.add(kind)
    if configs:
        return frozenset(kinds)
    return None if _mentions_sharding(root) else frozenset({"MULTI_GPU"})


_SHARDING_WORDS = re.compile(r"deepspeed|fsdp|fully_shard|megatron", re.IGNORECASE)
_REPOSITORY_TEXTS = (".py", ".yaml", ".yml", ".json", ".sh", ".md", ".txt", ".toml", ".cfg")


def _mentions_sharding(root: str) -> bool:
    """Whether any text file of the repository names DeepSpeed, FSDP or Megatron, or an
    ``accelerate launch --config_file`` (a config the repository does not ship). A
    repository that ships no Accelerate config and names none of them is launched with
    Accelerate's defaults (``accelerate launch`` on several GPUs: ``MULTI_GPU``, DDP);
    sharding would need a config or plugin the repository does not have."""
    texts = text_files(root, _REPOSITORY_TEXTS)
    return any(_SHARDING_WORDS.search(text) or _CONFIG_FLAG.search(text) for _, text in texts)


_CONFIG_FLAG = re.compile(r"accelerate\s+launch\b[^\n]*--config[_-]file")  # one not shipped


_LAUNCH_FLAGS = (
    ("--use_deepspeed", "DEEPSPEED"),
    ("--use-deepspeed", "DEEPSPEED"),
    ("--use_fsdp", "FSDP"),
    ("--use-fsdp", "FSDP"),
    ("--multi_gpu", "MULTI_GPU"),
    ("--multi-gpu", "MULTI_GPU"),
)


def _launched_types(text: str) -> list[str]:
    """The distributed types that the ``accelerate launch`` commands of a shell script choose
    by flag (``--multi_gpu``: DDP; ``--use_deepspeed``, ``--use_fsdp``), continuation lines
    joined. A command with a ``--config_file`` (or no flag) leaves the type to a config."""
    found: list[str] = []
    for command in text.replace("\\\n", " ").splitlines():
        if "accelerate launch" not in command or "config_file" in command.replace("-", "_"):
            continue
        words = command.split()
        kind = next((k for flag, k in _LAUNCH_FLAGS if flag in words), None)
        if kind is not None:
            found.append(kind)
    return found


def accelerate_unsharded(facts: ModuleFacts) -> bool:
    """The file's Accelerator is known not to shard: no plugin in the file, and the
    repository's Accelerate configs name no FSDP, DeepSpeed or Megatron type (``MULTI_GPU``,
    ``NO``), or there is none and nothing in the repository names one: DDP or one process."""
    if accelerate_sharding(facts) is not None or facts.path in ("", "<string>"):
        return False
    plugins = ("fsdp_plugin", "deepspeed_plugin", "megatron_lm_plugin")
    for call in facts.calls:
        if tail(call_name(call, facts.imports)) != "Accelerator":
            continue
        if any(kw.arg is None or kw.arg in plugins for kw in call.keywords):
            return False  # a plugin, or keyword arguments we cannot see
    kinds = _repository_types(repository_of(os.path.abspath(facts.path)))
    return kinds is not None and not kinds & {"FSDP", "DEEPSPEED", "MEGATRON_LM"}


def names_checkpoints(facts: ModuleFacts) -> bool:
    """``ProjectConfiguration(automatic_checkpoint_naming=True)`` in the file: Accelerate's
    ``save_state`` then synchronises the processes (a barrier) whatever the type."""
    for call in facts.calls:
        if tail(call_name(call, facts.imports)) == "ProjectConfiguration":
            value = keyword_arg(call, "automatic_checkpoint_naming")
            if value is not None and not (isinstance(value, ast.Constant) and not value.value):
                return True
    return False


def shards_anything(facts: ModuleFacts) -> bool:
    """Whether the file shards a model at all (an FSDP wrapper, ``fully_shard``, Accelerate's
    FSDP): only then is every attribute call worth asking :func:`sharded_model` about."""
    cached = facts.memo.get("shards-anything")
    if isinstance(cached, bool):
        return cached
    found = (
        any(tail(call_name(c, facts.imports)) in (*_FSDP_CALLS, "fully_shard") for c in facts.calls)
        or accelerate_sharding(facts) == "fsdp"
    )
    facts.memo["shards-anything"] = found
    return found


def sharded_model(expr: ast.expr, scope: Scope, facts: ModuleFacts, depth: int = 0) -> bool:
    """Whether ``expr`` holds a model whose parameters are sharded (see the module's text).

    Args:
        expr: The receiver of a forward, ``state_dict()``, ``save_pretrained()``…
        scope: Where it appears.
        facts: The file's facts.
        depth: Recursion guard.
    """
    key = dotted(expr)
    if key is None or depth > 4:
        return False
    if "fsdp" in facts.kinds(expr, scope) or key in _fully_sharded(facts):
        return True
    where = (id(scope.node), key)
    if where in _fsdp_context_models(facts) and not _other_branch(expr, where, facts):
        return True
    if accelerate_sharding(facts) == "fsdp" and key in _prepared(facts):
        return True
    if isinstance(expr, ast.Attribute) and expr.attr == "module":
        return _auto_wrapped(expr.value, scope, facts, depth)
    if isinstance(expr, ast.Name) and _passed_sharded(expr.id, scope, facts, depth):
        return True
    for value in facts.lookup_all(key, scope):
        if value is None or value is expr:
            continue
        inner = _unwrapped(value)
        if inner is not None and _auto_wrapped(inner, scope, facts, depth):
            return True
    return False


def _passed_sharded(name: str, scope: Scope, facts: ModuleFacts, depth: int) -> bool:
    """``name`` is a parameter of the function, never rebound in it, and every call of the
    function in this file passes a sharded model there (at least one call)."""
    func = scope.node
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    position = parameter_index(func, name)
    if position < 0 or any(v is not None for v in facts.lookup_all(name, scope)):
        return False
    sites = facts.calls_of(func)
    if not sites:
        return False
    for call, caller in sites:
        given = passed_at(call, func, position)
        if given is None or not sharded_model(given, caller, facts, depth + 1):
            return False
    return True


def _unwrapped(value: ast.expr) -> ast.expr | None:
    """``m`` of ``m.module`` or ``unwrap_model(m)`` (any receiver), else None."""
    if isinstance(value, ast.Attribute) and value.attr == "module":
        return value.value
    if (
        isinstance(value, ast.Call)
        and tail(dotted(value.func)) == "unwrap_model"
        and value.args
        and isinstance(value.args[0], (ast.Name, ast.Attribute))
    ):
        return value.args[0]
    return None


def _auto_wrapped(expr: ast.expr, scope: Scope, facts: ModuleFacts, depth: int) -> bool:
    """A sharded model whose inner layers are FSDP units of their own: FSDP built with an
    ``auto_wrap_policy`` (or keyword arguments we cannot see), or Accelerate's FSDP."""
    key = dotted(expr)
    if key is None:
        return False
    if accelerate_sharding(facts) == "fsdp" and key in _prepared(facts):
        return True
    for value in facts.lookup_all(key, scope):
        if not (
            isinstance(value, ast.Call) and tail(call_name(value, facts.imports)) in _FSDP_CALLS
        ):
            continue
        if keyword_arg(value, "auto_wrap_policy") is not None or any(
            k.arg is None for k in value.keywords
        ):
            return True
    return False


def _prepared(facts: ModuleFacts) -> frozenset[str]:
    """The names bound to what an Accelerator's ``prepare(...)`` returns (``model, opt, loader
    = accelerator.prepare(...)``; ``self.model = ...``)."""
    return names_returned_by(facts, ("prepare",), "accelerator")


def names_returned_by(facts: ModuleFacts, methods: tuple[str, ...], owner: str) -> frozenset[str]:
    """Every name the result of one of ``methods`` called on an ``owner`` object (an
    ``"accelerator"``, a ``"fabric"``: by what the receiver is bound to, or by its name) is
    assigned or unpacked into in the module (``model, opt = accelerator.prepare(...)``,
    ``self.model = fabric.setup(...)``)."""
    key = ("names-returned-by", methods, owner)
    cached = facts.memo.get(key)
    if isinstance(cached, frozenset):
        return cached
    names: set[str] = set()
    for node in facts.nodes:
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
            continue
        func = node.value.func
        if not (isinstance(func, ast.Attribute) and func.attr in methods):
            continue
        label = (dotted(func.value) or "").rsplit(".", 1)[-1].lower()
        if owner not in label and owner not in facts.kinds(
            func.value, facts.scope_containing(node)
        ):
            continue
        for target in node.targets:
            names.update(k for k in map(dotted, _unpacked(target)) if k is not None)
    found = facts.memo[key] = frozenset(names)
    return found


def _unpacked(target: ast.expr) -> Iterator[ast.expr]:
    """The leaves of an assignment target (``a, (b, *c) = ...`` gives ``a``, ``b``, ``c``)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _unpacked(element)
    elif isinstance(target, ast.Starred):
        yield from _unpacked(target.value)
    else:
        yield target


def _fully_sharded(facts: ModuleFacts) -> frozenset[str]:
    """The names passed to ``fully_shard(...)`` in this file (FSDP2 shards in place)."""
    sharded = facts.memo.get("fully-sharded")
    if isinstance(sharded, frozenset):
        return sharded
    names = set()
    for node in facts.calls:
        if tail(call_name(node, facts.imports)) == "fully_shard" and node.args:
            name = dotted(node.args[0])
            if name is not None:
                names.add(name)
    found = frozenset(names)
    facts.memo["fully-sharded"] = found
    return found


_FSDP_CONTEXTS = frozenset(
    {
        "state_dict_type",
        "optim_state_dict",
        "full_optim_state_dict",
        "sharded_optim_state_dict",
        "set_state_dict_type",
    }
)


def _fsdp_context_models(facts: ModuleFacts) -> frozenset[tuple[int, str]]:
    """Each ``(scope, name)`` whose name is the model argument of an FSDP class method called
    in that scope (``FSDP.state_dict_type(model, ...)``, or the same name imported from
    ``torch.distributed.fsdp``): a model FSDP shards."""
    cached = facts.memo.get("fsdp-context-models")
    if isinstance(cached, frozenset):
        return cached
    found: set[tuple[int, str]] = set()
    calls: dict[tuple[int, str], list[ast.Call]] = {}
    for call in facts.calls:
        func = call.func
        if isinstance(func, ast.Name) and call.args:  # `from torch.distributed.fsdp import ...`
            imported = facts.imports.resolve(func.id) or ""
            if not (imported.startswith("torch.distributed.fsdp.") and func.id in _FSDP_CONTEXTS):
                continue
        elif not (isinstance(func, ast.Attribute) and func.attr in _FSDP_CONTEXTS and call.args):
            continue
        elif tail(facts.imports.resolve(dotted(func.value))) not in _FSDP_CALLS:
            continue  # model.summon_full_params(): the receiver, not the argument
        name = dotted(call.args[0])
        if name is not None:
            where = (id(facts.scope_containing(call).node), name)
            found.add(where)
            calls.setdefault(where, []).append(call)
    facts.memo["fsdp-context-calls"] = calls
    result = facts.memo["fsdp-context-models"] = frozenset(found)
    return result


def _other_branch(expr: ast.expr, where: tuple[int, str], facts: ModuleFacts) -> bool:
    """Every FSDP class method call naming the model (``where``: its scope and name) of the
    scope sits in the other branch of an ``if``
    that holds ``expr`` (``if is_fsdp: with FSDP.state_dict_type(model, ...): ...`` / ``else:
    model.state_dict()``): the model there is the one the author does not shard."""
    calls = facts.memo.get("fsdp-context-calls")
    assert isinstance(calls, dict)  # filled with the models by _fsdp_context_models
    here = _branches(expr, facts)
    return all(
        any(here.get(node, side) != side for node, side in _branches(call, facts).items())
        for call in calls.get(where, [])
    )


def _branches(node: ast.AST, facts: ModuleFacts) -> dict[int, str]:
    """``id(if statement)`` -> ``"body"`` or ``"orelse"``, for each ``if`` that holds the node
    in one of its branches."""
    up = parents(facts)
    found: dict[int, str] = {}
    while (parent := up.get(id(node))) is not None:
        if isinstance(parent, ast.If) and node is not parent.test:
            found[id(parent)] = "body" if any(n is node for n in parent.body) else "orelse"
        node = parent
    return found
