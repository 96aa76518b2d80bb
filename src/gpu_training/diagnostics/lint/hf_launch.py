"""A Hugging Face ``Trainer`` script written to run in every process of a launch.

``TrainingArguments(..., local_rank=args.local_rank)`` or ``deepspeed=args.deepspeed``: the
script takes the launcher's rank or a DeepSpeed config, so ``torchrun``/``deepspeed`` starts
it once per GPU and every process runs it from the top. The ``Trainer`` guards its own saves
(``trainer.save_model``); the script's own writes (``model.save_pretrained(path)`` after
``trainer.train()``) run on every rank unless guarded (``trainer.is_world_process_zero()``).
A script that passes neither is not taken as distributed (one GPU is the common case).

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

from gpu_training.diagnostics.lint.calls import keyword_arg, tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted

__all__ = ["hf_every_process", "saves_on_each_node"]

_PACKAGES = ("transformers", "trl")
_LAUNCH_KEYWORDS = ("local_rank", "deepspeed")
_LAUNCHER_ENV = frozenset({"LOCAL_RANK", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE"})


def hf_every_process(facts: ModuleFacts) -> set[ast.AST]:
    """The scopes that build Hugging Face training arguments naming the launcher's rank or a
    DeepSpeed config, and train there: each runs in every process of the launch."""
    trains = {
        facts.scope_containing(c).node
        for c in facts.calls
        if isinstance(c.func, ast.Attribute) and c.func.attr == "train"
    }
    from_env = _reads_launcher_env(facts)
    return {
        facts.scope_containing(c).node
        for c in facts.calls
        if (_launch_arguments(facts, c) or (from_env and _hf_arguments(facts, c)))
        and facts.scope_containing(c).node in trains
    }


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


def _hf_arguments(facts: ModuleFacts, call: ast.Call) -> bool:
    name = call_name(call, facts.imports)
    return name.split(".")[0] in _PACKAGES and tail(name).endswith(("TrainingArguments", "Config"))


def _launch_arguments(facts: ModuleFacts, call: ast.Call) -> bool:
    name = call_name(call, facts.imports)
    last = tail(name)
    if name.split(".")[0] not in _PACKAGES or not last.endswith(("TrainingArguments", "Config")):
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
        if call_name(c, facts.imports).split(".")[0] in _PACKAGES
        and tail(call_name(c, facts.imports)).endswith(("TrainingArguments", "Config"))
        and isinstance(flag := keyword_arg(c, "save_on_each_node"), ast.Constant)
        and flag.value is True
    ]
