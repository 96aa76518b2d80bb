"""``task: hf`` options and bad input, FSDP units from ``_no_split_modules``, ``plan --hf-config``.

Bad input is one line naming the field or file, exit 2, nothing written; a name that would
need the Hugging Face Hub says how to fetch it first. No network anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import hf_runs as H
from dist_harness import REPO_ROOT, run_python
from gpu_training.config import ConfigError

TINY_LLAMA = REPO_ROOT / "configs" / "hf" / "tiny_llama.json"
INSTRUCTIONS = REPO_ROOT / "configs" / "hf" / "instructions.jsonl"


def _options(**changes: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "config": str(TINY_LLAMA),
        "tokenizer": str(H.TOKENIZER),
        "train_files": [str(INSTRUCTIONS)],
        "block_size": 32,
    }
    options.update(changes)
    return {k: v for k, v in options.items() if v is not None}


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (
            {"config": None, "model_dir": "meta-llama/Llama-3.2-1B"},
            "field 'task_options.model_dir': 'meta-llama/Llama-3.2-1B' is not a local directory; "
            "it looks like a Hugging Face Hub name and nothing is downloaded here: fetch it "
            "first (huggingface-cli download meta-llama/Llama-3.2-1B --local-dir",
        ),
        ({"config": None, "model_dir": "no/such/dir"}, "no/such/dir: no such directory; expected"),
        ({"model_dir": "."}, "give exactly one of model_dir"),
        ({"config": None}, "give exactly one of model_dir"),
        ({"config": "nope.json"}, "field 'task_options.config': nope.json: no such config.json"),
        ({"config": "gpt2/config"}, "huggingface-cli download gpt2/config --local-dir"),
        ({"config": {"hidden_size": 8}}, "a config mapping needs 'model_type'"),
        (
            {"config": {"model_type": "lama"}},
            "field 'task_options.config': not a usable model config",
        ),
        ({"tokenizer": "org/tok"}, "field 'task_options.tokenizer': 'org/tok' is not a local"),
        ({"dtype": "fp8"}, "field 'task_options.dtype': expected one of float32, bfloat16"),
        (
            {"train_files": ["missing/*.txt"]},
            "field 'task_options.train_files': missing/*.txt: no such file",
        ),
        ({"prompt_field": "prompt"}, "needs both prompt_field and response_field"),
        ({"val_fraction": 1.5}, "field 'task_options.val_fraction': expected a number in [0, 1)"),
        (
            {"block_size": 1000},
            "field 'task_options.block_size': 1000 exceeds the model's context (256",
        ),
        (
            {"lora": {"r": 4}},
            "field 'task_options.lora': LoRA adapts a pretrained base: give model_dir",
        ),
        ({"n_layer": 2}, "task 'hf' has no option 'n_layer'"),
        ({"modeldir": "x"}, "task 'hf' has no option 'modeldir' (did you mean 'model_dir'?)"),
        ({"attn_implementation": "magic"}, "field 'task_options.attn_implementation'"),
    ],
)
def test_bad_options_are_one_line_naming_the_field(changes: dict[str, Any], fragment: str) -> None:
    from gpu_training.tasks import resolve_task

    with pytest.raises(ConfigError) as info:
        task = resolve_task("hf", _options(**changes))
        task.build_model()
    assert fragment in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_lora_field_peft_does_not_know_is_named(tmp_path: Path) -> None:
    from gpu_training.tasks import resolve_task

    assets = {"base": str(tmp_path)}
    (tmp_path / "config.json").write_text(TINY_LLAMA.read_text())
    options = _options(config=None, tokenizer=None, model_dir=assets["base"])
    hint = r"LoraConfig has no field 'lora_alfa' \(did you mean 'lora_alpha'\?\)"
    with pytest.raises(ConfigError, match=hint):
        resolve_task("hf", {**options, "lora": {"r": 4, "lora_alfa": 8}})


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path: Path) -> None:
    from gpu_training.tasks import resolve_task

    small = json.loads(TINY_LLAMA.read_text()) | {"vocab_size": 100}
    task = resolve_task("hf", _options(config=small, cache_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="512 tokens do not fit the model's vocab_size 100"):
        task.build_data()


def test_train_refuses_a_hub_name_before_starting_ranks(tmp_path: Path) -> None:
    job = {
        "task": "hf",
        "task_options": {
            "model_dir": "meta-llama/Llama-3.2-1B",
            "train_files": [str(INSTRUCTIONS)],
        },
        "training": {"global_batch_size": 8, "per_device_batch_size": 4},
        "run": {"output_dir": str(tmp_path / "out")},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    proc = run_python(["-m", "gpu_training", "train", str(path), "--nproc", "2"], timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "huggingface-cli download meta-llama/Llama-3.2-1B" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_data_file_that_does_not_parse_fails_train_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n')
    job = {
        "task": "hf",
        "task_options": _options(train_files=[str(bad)], cache_dir=str(tmp_path / "cache")),
        "training": {"global_batch_size": 8, "per_device_batch_size": 4},
        "run": {"output_dir": str(tmp_path / "out")},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    proc = run_python(["-m", "gpu_training", "train", str(path), "--nproc", "2"], timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"gpu-training: error: data file {bad}: line 2 is not JSON (Expecting value); "
        "expected one JSON object per line (JSONL)"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_fsdp_units_come_from_no_split_modules() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpu_training.strategy import detect_blocks
    from gpu_training.strategy.wrap import declared_blocks

    with torch.device("meta"):
        for config, unit in ((H.LLAMA, "LlamaDecoderLayer"), (H.GPT2, "GPT2Block")):
            shape = {k: v for k, v in config.items() if k != "model_type"}
            model = AutoModelForCausalLM.from_config(
                AutoConfig.for_model(config["model_type"], **shape)
            )
            blocks = declared_blocks(model)
            assert [type(m).__name__ for _, m in blocks] == [unit, unit]
            assert detect_blocks(model) == blocks
        peft = get_peft_model(model, LoraConfig(r=2, target_modules=["c_attn"]))
        names = [name for name, _ in detect_blocks(peft)]
    assert names == [f"base_model.model.transformer.h.{i}" for i in (0, 1)]


def test_plan_measures_an_hf_config_on_the_meta_device() -> None:
    proc = run_python(
        ["-m", "gpu_training", "plan", "--hf-config", str(TINY_LLAMA), "--gpus", "8",
         "--gpu-memory", "80GB", "--seq", "128", "--json"],
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert "LlamaForCausalLM" in json.dumps(plan)
    bad = run_python(
        ["-m", "gpu_training", "plan", "--hf-config", "nope.json", "--gpu-memory", "80GB"],
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "--hf-config: nope.json: no such config.json" in bad.stderr


def test_transformers_is_imported_only_when_an_hf_task_builds() -> None:
    code = (
        "import sys, gpu_training\n"
        "assert 'torch' not in sys.modules\n"
        "from gpu_training.job import JobConfig\n"
        "JobConfig.from_dict({'task': 'hf', 'task_options': {'config': 'x.json'}})\n"
        "import gpu_training.tasks, gpu_training.trainer, gpu_training.cli\n"
        "assert 'transformers' not in sys.modules and 'peft' not in sys.modules\n"
    )
    proc = run_python(["-c", code], timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_dtype_and_attention_reach_the_model() -> None:
    import torch

    from gpu_training.tasks import resolve_task

    task = resolve_task("hf", _options(dtype="bfloat16", attn_implementation="eager"))
    model: Any = task.build_model()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config._attn_implementation == "eager" and model.config.use_cache is False
    assert task.tokens_per_sample == 32 and task.loss_sum is not None
    assert task.flops_per_token is not None and task.flops_per_token > 6 * 100_000


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (REPO_ROOT / "configs" / "hf").glob("*.yaml"))
)
def test_every_shipped_hf_job_loads_and_names_only_local_paths(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each job file checks; the paths it names ship here or are made by an earlier step of
    docs/huggingface.md (``runs/hf_pretrain/hf``, the pre-training's export)."""
    from gpu_training.job import load_job

    monkeypatch.chdir(REPO_ROOT)  # the files name paths from the repository root
    job = load_job(REPO_ROOT / "configs" / "hf" / name)
    assert job.task.name == "hf"
    options = job.task.options
    for key in ("config", "tokenizer", "train_files"):
        for path in [options[key]] if isinstance(options.get(key), str) else options.get(key, []):
            assert (REPO_ROOT / path).exists(), f"{name}: {key} {path} does not ship"
    if "model_dir" in options:
        assert options["model_dir"] == "runs/hf_pretrain/hf"
    else:
        from gpu_training.trainer import check_job

        assert "LlamaForCausalLM" in check_job(job).describe


def test_export_hf_refuses_what_it_cannot_export_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_training.cli import main
    from gpu_training.job import JobConfig
    from gpu_training.trainer import Trainer

    job = JobConfig.from_dict(
        {
            "task": "charlm",
            "task_options": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
            "training": {"global_batch_size": 4, "per_device_batch_size": 4, "max_steps": 1},
            "strategy": {"name": "none"},
            "run": {"output_dir": str(tmp_path / "run"), "plot": False, "tensorboard": False},
        }
    )
    Trainer(job, quiet=True).fit()
    ckpt = str(tmp_path / "run" / "checkpoints")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    cases = [
        ([ckpt, str(tmp_path / "out")], "holds no Hugging Face model (no 'hf' entry"),
        ([ckpt, str(tmp_path / "full")], "exists and is not empty; pass --force"),
        ([ckpt, f"{ckpt}/inside"], "is inside the checkpoint directory"),
        ([str(tmp_path / "none"), str(tmp_path / "out")], "ckpt export-hf:"),
    ]
    for argv, fragment in cases:
        assert main(["ckpt", "export-hf", *argv]) == 2
        err = capsys.readouterr().err
        assert fragment in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists() and (tmp_path / "full" / "x").read_text() == "keep me"
