"""``gpu-training lint`` ``GT007`` in the hooks of a callback handed to a training framework.

Issue 33, a miss of held-back set 11: a ``transformers.TrainerCallback`` whose ``on_save``
writes the adapter (``kwargs["model"].save_pretrained(...)``) with no rank test. The Hugging
Face ``Trainer`` calls every callback's hooks in every process of a ``torchrun`` launch, so each
process writes the same path; nothing in the project calls ``on_save``, so the lint never
walked it. Lightning calls a ``Callback``'s hooks on every rank as well. Minimal reproductions
written here, with the variants that stay quiet: a hook that tests
``state.is_world_process_zero`` or is ``@rank_zero_only``, a script launched as one process, a
class that only shares the method name.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_CALLBACK = """\
import os

from transformers import TrainerCallback


class SavePeftModelCallback(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        kwargs["model"].save_pretrained(os.path.join(folder, "adapter_model"))
        return control
"""

_TRAIN = """\
import transformers
from transformers import Trainer, TrainingArguments

from callbacks import SavePeftModelCallback


def main():
    parser = transformers.HfArgumentParser((TrainingArguments,))
    (training_args,) = parser.parse_args_into_dataclasses()
    model = transformers.AutoModelForCausalLM.from_pretrained("gpt2")
    trainer = Trainer(model=model, args=training_args, callbacks=[SavePeftModelCallback()])
    trainer.train()


if __name__ == "__main__":
    main()
"""

_LAUNCH = "torchrun --nproc_per_node 4 train.py --output_dir out\n"


def _gt007(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT007")


def test_a_trainer_callback_that_saves_from_every_process(tmp_path: Path) -> None:
    files = {"callbacks.py": _CALLBACK, "train.py": _TRAIN, "run.sh": _LAUNCH}
    assert _gt007(tmp_path, files) == [("callbacks.py", 9)]


def test_the_callback_in_the_script_itself(tmp_path: Path) -> None:
    script = _TRAIN.replace("from callbacks import SavePeftModelCallback\n", _CALLBACK)
    assert _gt007(tmp_path, {"train.py": script, "run.sh": _LAUNCH}) == [("train.py", 12)]


def test_the_callback_handed_as_a_class(tmp_path: Path) -> None:
    train = _TRAIN.replace(
        "callbacks=[SavePeftModelCallback()])",
        ")\n    trainer.add_callback(SavePeftModelCallback)",
    )
    files = {"callbacks.py": _CALLBACK, "train.py": train, "run.sh": _LAUNCH}
    assert _gt007(tmp_path, files) == [("callbacks.py", 9)]


def test_a_hook_that_tests_the_world_process_zero(tmp_path: Path) -> None:
    callback = _CALLBACK.replace(
        '        kwargs["model"]',
        '        if state.is_world_process_zero:\n            kwargs["model"]',
    )
    files = {"callbacks.py": callback, "train.py": _TRAIN, "run.sh": _LAUNCH}
    assert _gt007(tmp_path, files) == []


def test_a_script_launched_as_one_process(tmp_path: Path) -> None:
    files = {"callbacks.py": _CALLBACK, "train.py": _TRAIN, "run.sh": "python train.py\n"}
    assert _gt007(tmp_path, files) == []


def test_a_class_that_only_shares_the_hook_name(tmp_path: Path) -> None:
    callback = _CALLBACK.replace("(TrainerCallback)", "").replace(
        "from transformers import TrainerCallback\n", ""
    )
    train = _TRAIN.replace(
        "    trainer.train()\n", "    trainer.train()\n    keep = SavePeftModelCallback()\n"
    ).replace("callbacks=[SavePeftModelCallback()]", "callbacks=[]")
    files = {"callbacks.py": callback, "train.py": train, "run.sh": _LAUNCH}
    assert _gt007(tmp_path, files) == []


_LIGHTNING = """\
import lightning as L
import torch


class SaveEveryEpoch(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        torch.save(pl_module.state_dict(), "last.pt")


def main(model, data):
    trainer = L.Trainer(accelerator="gpu", devices=4, strategy="ddp", callbacks=[SaveEveryEpoch()])
    trainer.fit(model, data)


if __name__ == "__main__":
    main(None, None)
"""


def test_a_lightning_callback_that_saves_on_every_rank(tmp_path: Path) -> None:
    assert _gt007(tmp_path, {"train.py": _LIGHTNING}) == [("train.py", 7)]


def test_a_lightning_hook_on_rank_zero_only(tmp_path: Path) -> None:
    script = _LIGHTNING.replace(
        "    def on_train_epoch_end", "    @rank_zero_only\n    def on_train_epoch_end"
    ).replace(
        "import torch\n", "import torch\nfrom lightning.pytorch.utilities import rank_zero_only\n"
    )
    assert _gt007(tmp_path, {"train.py": script}) == []
