"""``GT019`` through the Hugging Face ``Trainer``: a bf16 model handed to a Trainer whose
optimizer is torch's AdamW.

``TrainingArguments(optim=...)`` defaults to ``"adamw_torch"`` (``"adamw_torch_fused"`` and
the older ``"adamw_hf"`` are the same update): the Trainer builds that optimizer over the
model's parameters as they are. ``bf16=True`` only turns on autocast; it converts nothing, so a
model loaded with ``from_pretrained(..., torch_dtype=torch.bfloat16)`` (or converted with
``.to(torch.bfloat16)``) is stepped in bf16 with no fp32 master copy. Not reported: arguments
that hand the run to DeepSpeed or FSDP (``deepspeed=``, ``fsdp=``: fp32 master weights or an
upcast of their own), an ``optim`` of another family (8-bit, paged, Adafactor), arguments not
built in the file (a command line may name DeepSpeed), a ``Trainer(optimizers=...)`` given its
own optimizer, and a file that trains adapters (PEFT, LoRA) or quantizes its weights: the
trained parameters are not the bf16 ones.

Example:
    >>> import ast
    >>> from gpu_training.diagnostics.lint.model import ModuleFacts
    >>> src = ("from transformers import Trainer, TrainingArguments\\n"
    ...        "model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)\\n"
    ...        "args = TrainingArguments(output_dir='out', bf16=True)\\n"
    ...        "trainer = Trainer(model=model, args=args, train_dataset=ds)\\n"
    ...        "trainer.train()\\n")
    >>> facts = ModuleFacts(ast.parse(src))
    >>> [(call.lineno, detail[:38]) for call, detail in bf16_trainers(facts)]
    [(2, 'model is bfloat16 and Trainer(...) (li')]
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.calls import call_arg, keyword_arg, node_start, tail
from gpu_training.diagnostics.lint.hf_trainers import builds_arguments, builds_trainer
from gpu_training.diagnostics.lint.model import ModuleFacts, call_name, dotted
from gpu_training.diagnostics.lint.precision import conversion

__all__ = ["bf16_trainers"]

_TORCH_ADAM = frozenset({"adamw_torch", "adamw_torch_fused", "adamw_hf"})
_ADAPTERS = ("get_peft_model", "LoraConfig", "PeftModel", "BitsAndBytesConfig")


def bf16_trainers(facts: ModuleFacts) -> list[tuple[ast.Call, str]]:
    """The bf16 conversions (``from_pretrained(torch_dtype=torch.bfloat16)``) of models the
    file hands to a Trainer that steps them with torch's AdamW.

    Args:
        facts: The file's facts.

    Returns:
        ``(the conversion, evidence)`` pairs, reported where the model is made bf16.
    """
    names = [call_name(c, facts.imports) for c in facts.calls]
    if any(n.startswith(("deepspeed.", "peft.")) or tail(n) in _ADAPTERS for n in names):
        return []
    if any(k.arg in ("load_in_4bit", "load_in_8bit") for c in facts.calls for k in c.keywords):
        return []
    found: list[tuple[ast.Call, str]] = []
    for call, name in zip(facts.calls, names, strict=True):
        if not builds_trainer(call, facts) or keyword_arg(call, "optimizers") is not None:
            continue
        scope = facts.scope_containing(call)
        model = call_arg(call, 0, "model")
        args = call_arg(call, 1, "args")
        if not isinstance(model, ast.Name) or not isinstance(args, ast.Name):
            continue
        made = _bf16_binding(facts, model, scope)
        settings = _arguments(facts, args, scope)
        if made is None or settings is None or not _torch_adam(settings):
            continue
        found.append(
            (
                made,
                f"{model.id} is bfloat16 and {tail(name)}(...) (line {call.lineno}) steps it "
                f"with torch's AdamW ({_optim_text(settings)}): no fp32 copy",
            )
        )
    return found


def _bf16_binding(facts: ModuleFacts, model: ast.Name, scope: object) -> ast.Call | None:
    """The call that made ``model`` bf16 (its last binding), unless a later call converts it
    back to fp32 (``model.float()``)."""
    values = facts.lookup(model.id, scope, node_start(model))  # type: ignore[arg-type]
    made = next(
        (
            v
            for v in values
            if isinstance(v, ast.Call) and (conversion(v, facts) or ("", None))[0] == "bfloat16"
        ),
        None,
    )
    if made is None or len(values) != 1:
        return None
    for call in facts.calls:
        back = conversion(call, facts)
        if back is not None and back[0] == "float32" and dotted(back[1]) == model.id:
            return None
    return made


def _arguments(facts: ModuleFacts, args: ast.Name, scope: object) -> ast.Call | None:
    """The ``TrainingArguments(...)`` (or ``SFTConfig``) the name was built from in this file,
    when it names no DeepSpeed or FSDP and hides nothing behind ``**kwargs``."""
    values = facts.lookup(args.id, scope, node_start(args))  # type: ignore[arg-type]
    if len(values) != 1 or not isinstance(values[0], ast.Call):
        return None
    built = values[0]
    if not builds_arguments(built, facts):
        return None
    if any(k.arg is None for k in built.keywords):
        return None
    for key in ("deepspeed", "fsdp"):
        value = keyword_arg(built, key)
        if value is not None and not (isinstance(value, ast.Constant) and not value.value):
            return None
    return built


def _torch_adam(settings: ast.Call) -> bool:
    optim = keyword_arg(settings, "optim")
    if optim is None:
        return True  # the default: "adamw_torch"
    return isinstance(optim, ast.Constant) and optim.value in _TORCH_ADAM


def _optim_text(settings: ast.Call) -> str:
    optim = keyword_arg(settings, "optim")
    return f"optim={ast.unparse(optim)}" if optim is not None else "the default optim"
