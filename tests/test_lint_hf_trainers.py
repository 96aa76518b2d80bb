"""``gpu-training lint``: one answer to "is this a Hugging Face trainer?" for every rule.

Three rules ask it: a Trainer script launched once per GPU runs its training function in every
process (``GT007`` for its own writes), a guarded ``save_model`` of a sharding Trainer hangs
(``GT009``), a bf16 model stepped by the Trainer's AdamW has no fp32 copy (``GT019``). Each
answered it its own way: one took any name ending in ``Trainer`` from transformers or trl but
not the file's own subclasses, the others a fixed list of five names and their subclasses, so
trl's ``GRPOTrainer`` stepping a bf16 model and a project's ``class TunedTrainer(Seq2SeqTrainer)``
in a launched script were each seen by one rule and missed by another.
"""

from __future__ import annotations

import ast

from gpu_training.diagnostics.lint.hf_trainers import builds_arguments, builds_trainer
from gpu_training.diagnostics.lint.model import ModuleFacts
from gpu_training.diagnostics.lint.report import lint_source

_GRPO = """\
import torch
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
args = GRPOConfig(output_dir="out", bf16=True)
trainer = GRPOTrainer(model=model, args=args, reward_funcs=reward, train_dataset=ds)
trainer.train()
"""

_LAUNCHED = """\
import json
import os

from transformers import HfArgumentParser, Seq2SeqTrainer, TrainingArguments


class TunedTrainer(Seq2SeqTrainer):
    pass


class LoggedTrainer(TunedTrainer):
    pass


def training_function(script_args, training_args):
    trainer = LoggedTrainer(model=build(script_args), args=training_args)
    trainer.train()
    with open(f"{training_args.output_dir}/summary.json", "w") as handle:
        json.dump({"done": True}, handle)


def main():
    parser = HfArgumentParser([ScriptArguments, TrainingArguments])
    script_args, training_args = parser.parse_args_into_dataclasses()
    print(os.environ["LOCAL_RANK"])
    training_function(script_args, training_args)


if __name__ == "__main__":
    main()
"""


def _codes(source: str, *codes: str) -> list[tuple[int, str]]:
    return sorted((f.line, f.code) for f in lint_source(source) if f.code in codes)


def test_trl_grpo_trainer_stepping_a_bf16_model_is_reported() -> None:
    assert _codes(_GRPO, "GT019") == [(5, "GT019")]


def test_its_own_optimizer_or_another_family_is_not() -> None:
    handed = _GRPO.replace("train_dataset=ds)", "train_dataset=ds, optimizers=(opt, None))")
    assert _codes(handed, "GT019") == []
    eight_bit = _GRPO.replace("bf16=True)", 'bf16=True, optim="adamw_bnb_8bit")')
    assert _codes(eight_bit, "GT019") == []


def test_a_trainer_derived_twice_in_the_file_runs_in_every_launched_process() -> None:
    assert _codes(_LAUNCHED, "GT007") == [(18, "GT007")]


def test_the_same_script_reading_no_launcher_state_is_one_process() -> None:
    alone = _LAUNCHED.replace('    print(os.environ["LOCAL_RANK"])\n', "")
    assert _codes(alone, "GT007") == []


def _calls(source: str) -> tuple[ModuleFacts, list[ast.Call]]:
    facts = ModuleFacts(ast.parse(source))
    return facts, facts.calls


def test_a_project_s_own_trainer_or_config_is_not_hugging_face_s() -> None:
    facts, calls = _calls(
        "from engine import Trainer, TrainingArguments\n"
        "from transformers import AutoConfig\n"
        "t = Trainer(model=m, args=TrainingArguments())\n"
        "c = AutoConfig.from_pretrained('m')\n"
        "u = Trainer(model=m)\n"
    )
    assert [builds_trainer(c, facts) for c in calls] == [False, False, False, False]
    assert [builds_arguments(c, facts) for c in calls] == [False, False, False, False]


def test_transformers_and_trl_names_however_imported() -> None:
    facts, calls = _calls(
        "import transformers\n"
        "import trl\n"
        "a = transformers.Seq2SeqTrainingArguments('out')\n"
        "t = transformers.Trainer(model=m, args=a)\n"
        "d = trl.DPOTrainer(model=m, args=trl.DPOConfig('out'))\n"
    )
    trainers = [c for c in calls if builds_trainer(c, facts)]
    arguments = [c for c in calls if builds_arguments(c, facts)]
    assert [ast.unparse(c.func) for c in trainers] == ["transformers.Trainer", "trl.DPOTrainer"]
    assert [ast.unparse(c.func) for c in arguments] == [
        "transformers.Seq2SeqTrainingArguments",
        "trl.DPOConfig",
    ]
