"""``gpu-training lint`` ``GT009``: the Hugging Face ``Trainer.save_model`` under a rank-0 guard
when the Trainer shards the model.

Issue 33 (the bugs that hang jobs): ``save_model`` "will only save from the main process", so
scripts guard it with ``if trainer.is_world_process_zero():``; under DeepSpeed ZeRO-3 it
gathers the partitioned weights first, and under FSDP the full state dict is an all-gather
(transformers 5.25's ``Trainer.save_model``, read): rank 0 waits in a gather the other ranks
never join (set 16's qwen-lora-finetune reader named it with its ZeRO-3 config; a user's report,
huggingface/transformers#31624, ran once the guard was removed). Minimal
reproductions written here; not reported: ZeRO-2, DDP, no guard, arguments from the command
line (nothing in the file says the Trainer shards).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_training.diagnostics.lint import lint_paths
from lint_repo import repo_findings, write_repo

_SCRIPT = """\
from transformers import HfArgumentParser, Trainer, TrainingArguments

{args}
trainer = Trainer(model=model, args=args, train_dataset=ds)
trainer.train()
{guard}
    trainer.save_model("final")
"""
_GUARD = "if trainer.is_world_process_zero():"


def _zero(stage: int) -> str:
    return json.dumps({"zero_optimization": {"stage": stage}, "bf16": {"enabled": True}})


def _found(tmp_path: Path, args: str, guard: str = _GUARD, stage: int = 3) -> list[tuple[str, int]]:
    files = {
        "train.py": _SCRIPT.replace("{args}", args).replace("{guard}", guard),
        "configs/ds_config.json": _zero(stage),
        "ds_zero.json": _zero(stage),
    }
    return repo_findings(tmp_path, files, "GT009")


@pytest.mark.parametrize(
    "args",
    [
        'args = TrainingArguments("out", deepspeed="ds_zero.json")',
        'args = TrainingArguments("out", deepspeed="configs/ds_config.json", bf16=True)',
        'args = TrainingArguments("out", deepspeed={"zero_optimization": {"stage": 3}})',
        'config = {"zero_optimization": {"stage": 3}}\nargs = TrainingArguments("out", deepspeed=config)',
        'args = TrainingArguments("out", fsdp="full_shard auto_wrap")',
    ],
    ids=["zero3-json-beside", "zero3-json-in-repo", "zero3-dict", "zero3-dict-by-name", "fsdp"],
)
def test_a_guarded_save_model_of_a_sharding_trainer_hangs(tmp_path: Path, args: str) -> None:
    line = 7 + args.count("\n")
    assert _found(tmp_path, args) == [("train.py", line)]


@pytest.mark.parametrize(
    ("args", "guard", "stage"),
    [
        ('args = TrainingArguments("out", deepspeed="ds_zero.json")', _GUARD, 2),
        ('args = TrainingArguments("out", bf16=True)', _GUARD, 3),
        ('args = TrainingArguments("out", deepspeed="ds_zero.json")', "if True:", 3),
        ("(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()", _GUARD, 3),
    ],
    ids=["zero2", "ddp", "every-rank", "command-line-arguments"],
)
def test_no_gather_or_no_guard_is_no_hang(
    tmp_path: Path, args: str, guard: str, stage: int
) -> None:
    assert _found(tmp_path, args, guard, stage) == []


@pytest.mark.parametrize(
    "config",
    [
        "[" * 200_000 + "]" * 200_000,
        "{not json",
        '{"zero_optimization": {"stage": 3}}' + " " * (1 << 20),
    ],
    ids=["nested-too-deep", "not-json", "larger-than-a-config"],
)
def test_a_hostile_config_file_is_unknown_and_the_script_still_linted(
    tmp_path: Path, config: str
) -> None:
    # the deep one raised RecursionError in json.load: the script was "nested too deeply to
    # analyse (file not linted)", though the script itself is ordinary
    script = _SCRIPT.replace("{args}", 'args = TrainingArguments("out", deepspeed="ds.json")')
    files = {"train.py": script.replace("{guard}", _GUARD), "ds.json": config}
    report = lint_paths([write_repo(tmp_path, files)])
    assert not report.errors and report.files == 1
    assert [f for f in report.findings if f.code == "GT009"] == []
