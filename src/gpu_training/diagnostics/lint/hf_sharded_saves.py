"""The Hugging Face ``Trainer.save_model`` is a collective when the Trainer shards the model.

``save_model`` says it "will only save from the main process", and scripts wrap it in ``if
trainer.is_world_process_zero():`` anyway. Under DeepSpeed ZeRO-3 it gathers the partitioned
weights first (``_zero3_consolidated_16bit_state_dict``, or the engine's ``save_checkpoint``
without ``stage3_gather_16bit_weights_on_model_save``), and under FSDP with a full state dict
``accelerator.get_state_dict`` all-gathers them: every rank must call it, and the guarded call
hangs rank 0 in a gather the others never join (transformers 5.25 read). Under DDP and ZeRO-1/2
it writes from the main process alone, collective-free.

What counts as sharding here, from the file alone: the ``TrainingArguments`` (or ``SFTConfig``)
the Trainer is given, built in the file, with ``fsdp=`` set, or ``deepspeed=`` naming a
config whose ``zero_optimization.stage`` is 3 (a dict written in the file, or a JSON file
found beside the script or at the repository's root). Arguments parsed from the command line
are not known, and nothing is reported for them.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("from transformers import Trainer, TrainingArguments\\n"
    ...        "args = TrainingArguments('out', deepspeed={'zero_optimization': {'stage': 3}})\\n"
    ...        "trainer = Trainer(model=model, args=args)\\n"
    ...        "trainer.save_model()\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> call = facts.calls[-1]
    >>> trainer_shards(call.func.value, facts.scope_containing(call), facts)
    'ZeRO-3: deepspeed= at line 2'
"""

from __future__ import annotations

import ast
import json
import os

from gpu_training.diagnostics.lint.calls import call_arg, keyword_arg, node_start
from gpu_training.diagnostics.lint.hf_trainers import builds_arguments, builds_trainer
from gpu_training.diagnostics.lint.model import ModuleFacts, Scope, dotted
from gpu_training.diagnostics.lint.repo_files import MAX_TEXT_BYTES, repository_of

__all__ = ["trainer_shards"]


def trainer_shards(receiver: ast.expr, scope: Scope, facts: ModuleFacts) -> str | None:
    """How the Hugging Face Trainer ``receiver`` holds shards the model (``"ZeRO-3: ..."``,
    ``"FSDP: ..."``), or None: not a Trainer of the file, or not known to shard.

    Args:
        receiver: The object ``save_model`` is called on (``trainer``, ``self.trainer``).
        scope: Where the call is.
        facts: The file's facts.
    """
    key = dotted(receiver)
    if key is None:
        return None
    for value in facts.lookup(key, scope, node_start(receiver)):
        if not (isinstance(value, ast.Call) and builds_trainer(value, facts)):
            continue
        arguments = _arguments(call_arg(value, 1, "args"), scope, facts)
        if arguments is not None:
            found = _sharding(arguments, scope, facts)
            if found is not None:
                return found
    return None


def _arguments(expr: ast.expr | None, scope: Scope, facts: ModuleFacts) -> ast.Call | None:
    """The ``TrainingArguments(...)`` call ``expr`` is (or the one name it was bound to)."""
    if isinstance(expr, ast.Name):
        values = facts.lookup(expr.id, scope, node_start(expr))
        expr = values[0] if len(values) == 1 else None
    if isinstance(expr, ast.Call) and builds_arguments(expr, facts):
        return expr
    return None


def _sharding(arguments: ast.Call, scope: Scope, facts: ModuleFacts) -> str | None:
    fsdp = keyword_arg(arguments, "fsdp")
    if isinstance(fsdp, ast.Constant) and isinstance(fsdp.value, str) and fsdp.value.strip():
        return f"FSDP: fsdp={fsdp.value!r} at line {arguments.lineno}"
    if isinstance(fsdp, (ast.List, ast.Tuple)) and fsdp.elts:
        return f"FSDP: fsdp= at line {arguments.lineno}"
    config = keyword_arg(arguments, "deepspeed")
    if isinstance(config, ast.Name):
        values = facts.lookup(config.id, scope, node_start(config))
        config = values[0] if len(values) == 1 else None
    if config is None:
        return None
    stage = _zero_stage(config, facts)
    if stage == 3:
        return f"ZeRO-3: deepspeed= at line {arguments.lineno}"
    return None


def _zero_stage(config: ast.expr, facts: ModuleFacts) -> object:
    """``zero_optimization.stage`` of a DeepSpeed config: a dict written out, or a JSON file."""
    data: object = None
    if isinstance(config, ast.Dict):
        try:
            data = ast.literal_eval(config)
        except (ValueError, TypeError, RecursionError):  # not a literal all the way down
            return None
    elif isinstance(config, ast.Constant) and isinstance(config.value, str):
        data = _json_config(config.value, facts)
    if not isinstance(data, dict):
        return None
    zero = data.get("zero_optimization")
    return zero.get("stage") if isinstance(zero, dict) else None


def _json_config(name: str, facts: ModuleFacts) -> object:
    """The JSON file ``name`` as a script run from its own directory or from the repository's
    root would open it (None when neither has it, or it is not JSON, larger than the lint reads
    of any file, or nested past what the parser recurses into: the script is still linted)."""
    if facts.path in ("", "<string>") or not name.endswith(".json"):
        return None
    here = os.path.dirname(os.path.abspath(facts.path))
    for base in (here, repository_of(os.path.abspath(facts.path))):
        path = os.path.join(base, name)
        if os.path.isfile(path):
            try:
                if os.path.getsize(path) > MAX_TEXT_BYTES:
                    return None
                with open(path, encoding="utf-8") as handle:
                    return json.load(handle)
            except (OSError, ValueError, RecursionError):
                return None
    return None
