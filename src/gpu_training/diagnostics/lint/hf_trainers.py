"""Which calls build a Hugging Face trainer (transformers' ``Trainer`` and its kin, trl's
trainers, the file's own classes derived from them) and its arguments.

One answer for every rule that asks (a Trainer script runs in every process of its launch,
``save_model`` shards under ZeRO-3 or FSDP, a bf16 model stepped by the Trainer's AdamW): a
call builds a trainer when its callee, resolved through the file's imports, is a class of
``transformers`` or ``trl`` whose name ends in ``Trainer`` (``Trainer``, ``Seq2SeqTrainer``,
``SFTTrainer``, ``DPOTrainer``, ``GRPOTrainer`` ...), or a class the file defines over one of
them, at any depth. A ``Trainer`` the file never imports, or imports from a project module,
is not taken for one: many projects name their own loop ``Trainer``.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("from transformers import Trainer\\n"
    ...        "class Mine(Trainer): pass\\n"
    ...        "class Yours(Mine): pass\\n"
    ...        "a = Yours(model=m)\\n"
    ...        "b = Runner(model=m)\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> [builds_trainer(c, facts) for c in facts.calls]
    [True, False]
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import tail
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted

__all__ = ["PACKAGES", "builds_arguments", "builds_trainer", "trainer_classes"]

PACKAGES = ("transformers", "trl")


def trainer_classes(facts: ModuleFacts) -> frozenset[str]:
    """The file's own classes derived, at any depth, from a Hugging Face trainer class."""
    cached = facts.memo.get("hf-trainer-classes")
    if cached is None:
        classes = [n for n in facts.nodes if isinstance(n, ast.ClassDef)]
        found: set[str] = set()
        grew = True
        while grew:  # a class over a class over Trainer: as deep as the file goes
            grew = False
            for node in classes:
                if node.name not in found and any(
                    _is_trainer_name(facts.imports.resolve(dotted(b)) or "", found)
                    for b in node.bases
                ):
                    found.add(node.name)
                    grew = True
        cached = facts.memo["hf-trainer-classes"] = frozenset(found)
    assert isinstance(cached, frozenset)
    return cached


def builds_trainer(call: ast.Call, facts: ModuleFacts) -> bool:
    """The call builds a Hugging Face trainer (see the module's text)."""
    return _is_trainer_name(call_name(call, facts.imports), trainer_classes(facts))


def builds_arguments(call: ast.Call, facts: ModuleFacts) -> bool:
    """The call builds a trainer's arguments: transformers' ``TrainingArguments`` (and
    ``Seq2SeqTrainingArguments``), or a trl config (``SFTConfig``, ``DPOConfig``,
    ``GRPOConfig`` ...), each a ``TrainingArguments``."""
    name = call_name(call, facts.imports)
    root, last = name.split(".")[0], tail(name)
    return (root in PACKAGES and last.endswith("TrainingArguments")) or (
        root == "trl" and last.endswith("Config")
    )


def _is_trainer_name(name: str, derived: set[str] | frozenset[str]) -> bool:
    if name.split(".")[0] in PACKAGES and tail(name).endswith("Trainer"):
        return True
    return "." not in name and name in derived
