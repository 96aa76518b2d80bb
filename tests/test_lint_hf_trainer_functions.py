"""``gpu-training lint``: a Hugging Face script whose ``main()`` parses and whose ``train()`` trains.

A DeepSpeed LoRA script (issue 33, set 19) parses ``HfArgumentParser`` in ``main()`` and hands
the arguments to ``training_function(script_args, training_args)``, which builds the
``Trainer``, trains, and then reads ``trainer.args.process_index`` (the launcher's global
rank) to pick a GPU with ``torch.cuda.device(...)``: a script written for a launch of several
processes, whose training function runs in every process (``GT018`` for the global rank as a
GPU index; ``GT007`` for its own unguarded writes). The variants read
``training_args.local_rank`` in ``main`` or a ``LOCAL_RANK`` variable, with TRL's
``SFTTrainer`` and ``Seq2SeqTrainer``; the same script reading no launcher state is one
process (the common one-GPU case) and reports nothing.
"""

from __future__ import annotations

import pytest

from gpu_training.diagnostics.lint.report import lint_source

_SCRIPT = """\
import json

import torch
from transformers import HfArgumentParser, {trainer_class}, TrainingArguments


def report_memory(proc_id):
    with torch.cuda.device(proc_id):
        peak = torch.cuda.max_memory_allocated()
    return peak


def training_function(script_args, training_args):
    trainer = {trainer_class}(model=build(script_args), args=training_args)
    trainer.train()
    {after}
    with open(f"{{training_args.output_dir}}/summary.json", "w") as handle:
        json.dump({{"done": True}}, handle)


def main():
    parser = HfArgumentParser([ScriptArguments, TrainingArguments])
    script_args, training_args = parser.parse_args_into_dataclasses()
    {main_extra}
    training_function(script_args, training_args)


if __name__ == "__main__":
    main()
"""


def _codes(source: str) -> list[tuple[int, str]]:
    return sorted((f.line, f.code) for f in lint_source(source) if f.code in ("GT007", "GT018"))


def test_the_trainer_s_global_rank_picks_a_gpu() -> None:
    source = _SCRIPT.format(
        trainer_class="Trainer", after="report_memory(trainer.args.process_index)", main_extra=""
    )
    assert _codes(source) == [(8, "GT018"), (17, "GT007")]


@pytest.mark.parametrize(
    ("trainer_class", "main_extra"),
    [
        ("Seq2SeqTrainer", "print(training_args.local_rank)"),
        ("Trainer", "print(os.environ['LOCAL_RANK'])"),
    ],
)
def test_launch_state_read_in_main_makes_the_training_function_per_process(
    trainer_class: str, main_extra: str
) -> None:
    source = _SCRIPT.format(trainer_class=trainer_class, after="pass", main_extra=main_extra)
    source = source.replace("import json\n", "import json\nimport os\n")
    lines = [line for line, code in _codes(source) if code == "GT007"]
    assert lines == [18]


def test_trl_sft_trainer_reading_its_process_index() -> None:
    source = _SCRIPT.format(
        trainer_class="SFTTrainer", after="print(trainer.args.process_index)", main_extra=""
    ).replace(
        "from transformers import HfArgumentParser, SFTTrainer, TrainingArguments",
        "from transformers import HfArgumentParser, TrainingArguments\nfrom trl import SFTTrainer",
    )
    assert _codes(source) == [(18, "GT007")]


def test_a_script_reading_no_launcher_state_is_one_process() -> None:
    source = _SCRIPT.format(trainer_class="Trainer", after="pass", main_extra="")
    assert _codes(source) == []
