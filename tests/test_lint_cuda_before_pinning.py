"""``gpu-training lint`` ``GT002``: the bare ``cuda`` device used before a library pins the process.

Issue 33, set 13 (a row the truth marks doubtful, decided here as the rule's case): a Hugging
Face ``Trainer`` script that the repository launches with ``deepspeed --num_gpus=2`` moves the
model with ``.to("cuda")`` before it builds ``TrainingArguments``, whose set-up is what calls
``set_device(local_rank)``: until then every rank's current GPU is ``cuda:0``, so every rank
materialises its full model there. Minimal reproductions written here, with an Accelerate
variant; not reported: the same script run as one process, a script that pins the device
itself, and a move made after the pinning construction.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_HF_TRAINER = """\
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments


class LmTrainer(Trainer):
    def __init__(self, name, out_dir, dataset):
        model = AutoModelForCausalLM.from_pretrained(name).to("cuda")
        args = TrainingArguments(output_dir=out_dir, fp16=True)
        super().__init__(model, args, train_dataset=dataset)


if __name__ == "__main__":
    LmTrainer("gpt2", "out", build_dataset()).train()
"""

_ACCELERATE = """\
import os
import torch
from accelerate import Accelerator


def main(loader):
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    net = torch.nn.Linear(512, 512).cuda()
    accelerator = Accelerator()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    net, optimizer, loader = accelerator.prepare(net, optimizer, loader)
    for x in loader:
        accelerator.backward(net(x).sum())
        optimizer.step()


main(build_loader())
"""


def _gt002(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT002")


def test_a_launched_trainer_moves_its_model_before_training_arguments(tmp_path: Path) -> None:
    files = {"trainer.py": _HF_TRAINER, "train.sh": "deepspeed --num_gpus=2 trainer.py\n"}
    assert _gt002(tmp_path, files) == [("trainer.py", 6)]


def test_the_same_trainer_run_as_one_process(tmp_path: Path) -> None:
    files = {"trainer.py": _HF_TRAINER, "train.sh": "python trainer.py\n"}
    assert _gt002(tmp_path, files) == []


def test_a_move_after_the_pinning_construction(tmp_path: Path) -> None:
    text = _HF_TRAINER.replace(
        '        model = AutoModelForCausalLM.from_pretrained(name).to("cuda")\n'
        "        args = TrainingArguments(output_dir=out_dir, fp16=True)\n",
        "        args = TrainingArguments(output_dir=out_dir, fp16=True)\n"
        '        model = AutoModelForCausalLM.from_pretrained(name).to("cuda")\n',
    )
    files = {"trainer.py": text, "train.sh": "torchrun --nproc_per_node 4 trainer.py\n"}
    assert _gt002(tmp_path, files) == []


def test_accelerate_reading_local_rank_and_cuda_before_the_accelerator(tmp_path: Path) -> None:
    assert _gt002(tmp_path, {"train.py": _ACCELERATE}) == [("train.py", 8)]


def test_a_script_that_pins_the_device_itself(tmp_path: Path) -> None:
    text = _ACCELERATE.replace(
        '    local_rank = int(os.environ.get("LOCAL_RANK", 0))\n',
        '    local_rank = int(os.environ.get("LOCAL_RANK", 0))\n'
        "    torch.cuda.set_device(local_rank)\n",
    )
    assert _gt002(tmp_path, {"train.py": text}) == []
