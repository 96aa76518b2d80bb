"""``gpu-training lint``: a copy of a launched Hugging Face script runs once per process too.

``train.sh`` starts ``accelerate launch train/fine-tune_custom.py`` (issue 33, set 12); beside
it ``fine-tune_hub.py`` is the same Seq2SeqTrainer script reading another data source. Its
author runs it the same way, so its ``processor.save_pretrained(output_dir)`` after training
runs on every rank (``GT007``), as in the launched script. The variant is a TRL script copied
for another model under ``torchrun``; a different script of the same directory, one the
launcher does not start and that shares little of its code, stays one process.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths

_SCRIPT = """\
import argparse

from datasets import {loader}
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, WhisperProcessor

parser = argparse.ArgumentParser()
parser.add_argument("--model_name", default="openai/whisper-small")
parser.add_argument("--output_dir", default="out")
parser.add_argument("--train_batchsize", type=int, default=8)
parser.add_argument("--num_steps", type=int, default=1000)
args = parser.parse_args()

processor = WhisperProcessor.from_pretrained(args.model_name)
training_args = Seq2SeqTrainingArguments(
    output_dir=args.output_dir,
    per_device_train_batch_size=args.train_batchsize,
    max_steps=args.num_steps,
    fp16=True,
    save_strategy="steps",
)
dataset = {loader}(args.data)
model = build(args.model_name)
trainer = Seq2SeqTrainer(model=model, args=training_args, train_dataset=dataset)
processor.save_pretrained(training_args.output_dir)
trainer.train()
"""


def _gt007(tmp_path: Path, files: dict[str, str], name: str) -> list[int]:
    (tmp_path / ".git").mkdir()
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return [f.line for f in report.findings if f.code == "GT007" and f.path.endswith(name)]


def test_a_copy_of_the_launched_script_writes_on_every_rank(tmp_path: Path) -> None:
    files = {
        "train.sh": "accelerate launch train/fine-tune_custom.py --output_dir out\n",
        "train/fine-tune_custom.py": _SCRIPT.format(loader="load_from_disk"),
        "train/fine-tune_hub.py": _SCRIPT.format(loader="load_dataset"),
    }
    assert _gt007(tmp_path, files, "fine-tune_hub.py") == [24]


def test_a_trl_copy_under_torchrun(tmp_path: Path) -> None:
    script = _SCRIPT.format(loader="load_dataset").replace(
        "trainer = Seq2SeqTrainer(", "trainer = SFTTrainer("
    )
    script = script.replace(
        "from transformers import Seq2SeqTrainer,",
        "from trl import SFTTrainer\nfrom transformers import",
    )
    files = {
        "run.sh": "torchrun --nproc_per_node 8 sft_llama.py\n",
        "sft_llama.py": script,
        "sft_qwen.py": script.replace("openai/whisper-small", "Qwen/Qwen2-7B"),
    }
    assert _gt007(tmp_path, files, "sft_qwen.py") == [25]


def test_an_unrelated_script_of_the_same_directory_stays_one_process(tmp_path: Path) -> None:
    other = (
        "from transformers import Trainer, TrainingArguments\n\n"
        "args = TrainingArguments(output_dir='eval_out')\n"
        "trainer = Trainer(model=load(), args=args)\n"
        "trainer.train()\n"
        "trainer.model.save_pretrained('eval_out/final')\n"
    )
    files = {
        "train.sh": "accelerate launch train/fine-tune_custom.py\n",
        "train/fine-tune_custom.py": _SCRIPT.format(loader="load_from_disk"),
        "train/probe.py": other,
    }
    assert _gt007(tmp_path, files, "probe.py") == []
