"""``gpu-training lint``: a script the repository's shell scripts launch once per GPU.

A Hugging Face ``Trainer`` script whose arguments come from ``HfArgumentParser`` says nothing
about how many processes run it; the repository's own launch script does (``deepspeed
src/train.py --deepspeed ds.json``, ``torchrun --nproc_per_node 8 train.py``). Started that
way, its ``save_pretrained()`` after ``trainer.train()`` runs in every process (``GT007``).
Started as one process (``python train.py``, ``--nproc_per_node 1``), it does not. Each
repository is a minimal reproduction written here (issue 33, set 10's DeepSpeed LoRA script).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_TRAIN = """\
import transformers
from transformers import Trainer


def train(model, dataset):
    parser = transformers.HfArgumentParser((transformers.TrainingArguments,))
    (training_args,) = parser.parse_args_into_dataclasses()
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset)
    trainer.train()
    model.save_pretrained(training_args.output_dir)


if __name__ == "__main__":
    train(None, None)
"""
_SAVE_LINE = 10


def _repository(tmp_path: Path, launch: str, script: str = _TRAIN) -> Path:
    (tmp_path / ".git").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train_lora.py").write_text(script)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "run.sh").write_text(f"#!/bin/bash\nexport M=7b\n{launch}\n")
    return tmp_path


def _writes(root: Path) -> set[int]:
    report = lint_paths([root])
    assert not report.errors, report.errors
    return {f.line for f in report.findings if f.code == "GT007"}


@pytest.mark.parametrize(
    "launch",
    [
        "srun --nodes=1 --gpus-per-node=3 deepspeed ../src/train_lora.py \\\n"
        "    --deepspeed ../configs/ds_zero1.json --output_dir out",
        "torchrun --nproc_per_node 8 src/train_lora.py --output_dir out",
        "python -m torch.distributed.launch --nproc_per_node=4 src/train_lora.py",
        "accelerate launch --multi_gpu src/train_lora.py --output_dir out  # 8 GPUs",
        # the script run as a module (set 21: `torchrun ... -m scripts.train_attention_unet`)
        "torchrun --standalone --nnodes=1 --nproc_per_node=${NPROC} -m src.train_lora --out o",
        "accelerate launch --multi_gpu --module src.train_lora",
        "torchrun --nproc_per_node=3 -m src.train_lora.py  # a stray suffix: the intent shows",
    ],
)
def test_a_script_launched_once_per_gpu_writes_on_every_rank(tmp_path: Path, launch: str) -> None:
    assert _SAVE_LINE in _writes(_repository(tmp_path, launch))


@pytest.mark.parametrize(
    "launch",
    [
        "python src/train_lora.py --output_dir out",
        "torchrun --nproc_per_node 1 src/train_lora.py",
        "deepspeed --num_gpus=1 src/train_lora.py --deepspeed ds.json",
        "torchrun --nproc_per_node 8 src/other_script.py",
        "# deepspeed src/train_lora.py (commented out)",
        "torchrun --nproc_per_node 8 -m src.other_script",
        "python -m src.train_lora --output_dir out",
    ],
)
def test_one_process_or_another_script_is_not_distributed(tmp_path: Path, launch: str) -> None:
    assert _SAVE_LINE not in _writes(_repository(tmp_path, launch))


def test_a_guarded_save_is_left_alone(tmp_path: Path) -> None:
    guarded = _TRAIN.replace(
        "    model.save_pretrained(training_args.output_dir)\n",
        "    if trainer.is_world_process_zero():\n"
        "        model.save_pretrained(training_args.output_dir)\n",
    )
    assert not _writes(_repository(tmp_path, "deepspeed src/train_lora.py", guarded))


_HELPER_ARGS = """\
import json
import os

from transformers import Trainer

from src.utils import parse_args, safe_training_args


def train(args):
    training_args = safe_training_args(args)
    trainer = Trainer(model=None, args=training_args)
    trainer.train()
    with open(os.path.join(args.output_dir, "id2label.json"), "w") as f:
        json.dump({0: "a"}, f)


if __name__ == "__main__":
    train(parse_args())
"""
_UTILS = """\
import argparse

from transformers import TrainingArguments


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="out")
    return parser.parse_args()


def safe_training_args(args):
    return TrainingArguments(output_dir=args.output_dir, per_device_train_batch_size=8)
"""


@pytest.mark.parametrize(
    ("launch", "expected"),
    [("torchrun --nproc_per_node=4 -m src.train_unet", {13}), ("python -m src.train_unet", set())],
)
def test_training_arguments_built_by_a_project_helper_still_run_in_every_process(
    tmp_path: Path, launch: str, expected: set[int]
) -> None:
    # set 21: the arguments come from scripts/utils.py's safe_training_args(...)
    root = _repository(tmp_path, launch, script="")
    (root / "src" / "train_lora.py").unlink()
    (root / "src" / "__init__.py").write_text("")
    (root / "src" / "train_unet.py").write_text(_HELPER_ARGS)
    (root / "src" / "utils.py").write_text(_UTILS)
    assert _writes(root) == expected
