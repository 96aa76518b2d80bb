"""Hugging Face causal LMs through the Trainer on 2 CPU ranks: parity, resume, export, LoRA.

One module-scoped set of runs, shared by every test (process starts cost seconds each):

- one process (the reference): Llama, GPT-2 (tied embeddings, dropout 0.1, eager
  attention) and LoRA on instruction data (targets -100 on the prompts);
- 2 ranks, one process group, the jobs in turn: Llama under DDP, FSDP2 and ZeRO-3, GPT-2
  under FSDP2 (activation checkpointing per block) and ZeRO-3, LoRA under FSDP2;
- 2 fresh ranks resuming the FSDP2 Llama and LoRA runs from step 5 after their step-10
  checkpoints were moved away (every bit of in-memory state lost, as after a kill).

Every job is 10 AdamW steps of a global batch of 8 in fp32 (1 rank x 4 x 2 accumulation, or
2 ranks x 4), checkpoints at 5 and 10. Figures: benchmarks/README.md ("Hugging Face").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import hf_runs as H
from dist_harness import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(400)]

TOL = 1e-5
INSTRUCTIONS = H.INSTRUCTIONS
LORA = H.LORA


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from gpu_training.tasks.hf import HFTaskOptions, hf_task

    root = tmp_path_factory.mktemp("hf")
    assets = H.make_assets(root / "assets")
    llama = H.task_options(assets, H.LLAMA)
    gpt2 = H.gpt2_options(assets)
    lora = H.lora_options(assets)
    hf_task(HFTaskOptions(**lora)).build_data()  # tokenized here: the ranks read the cache
    jobs = {
        "ddp": H.job(root / "ddp", llama, {"name": "ddp"}),
        "fsdp": H.job(root / "fsdp", llama, {"name": "fsdp"}),
        "zero3": H.job(root / "zero3", llama, {"name": "deepspeed", "zero_stage": 3}),
        "gpt2_fsdp": H.job(root / "gpt2_fsdp", gpt2, {"name": "fsdp", "activation_checkpointing": True}),
        "gpt2_zero3": H.job(root / "gpt2_zero3", gpt2, {"name": "deepspeed", "zero_stage": 3}),
        "lora_fsdp": H.job(root / "lora_fsdp", lora, {"name": "fsdp"}),
        "lora_ddp": H.job(root / "lora_ddp", lora, {"name": "ddp"}),
        "lora_zero3": H.job(root / "lora_zero3", lora, {"name": "deepspeed", "zero_stage": 3}),
    }  # fmt: skip
    refs = H.train_jobs(
        {
            "llama": H.job(root / "ref_llama", llama, {"name": "none"}),
            "gpt2": H.job(root / "ref_gpt2", gpt2, {"name": "none"}),
            "lora": H.job(root / "ref_lora", lora, {"name": "none"}),
        }
    )
    results = run_ranks(H.train_jobs, 2, args=(jobs,), timeout=300)[0]
    again = ("fsdp", "lora_fsdp", "lora_zero3")
    for name in again:  # "killed" after step 5: its step 10 never happened
        checkpoints = root / name / "checkpoints"
        shutil.move(checkpoints / "step-00000010", root / f"{name}-uninterrupted")
    resumed = run_ranks(H.train_jobs, 2, args=({k: jobs[k] for k in again},), timeout=200)[0]
    return {"root": root, "assets": assets, "refs": refs, "results": results, "resumed": resumed}


def _weights(step_dir: Path, tmp: Path) -> dict[str, torch.Tensor]:
    from gpu_training.checkpoint import consolidate

    out = consolidate(
        step_dir, tmp / f"{step_dir.parent.parent.name}-{step_dir.name}.pt", overwrite=True
    )
    return torch.load(out, weights_only=True)  # fmt: skip


def _last(runs: dict[str, Any], name: str) -> Path:
    return Path(runs["root"]) / name / "checkpoints" / f"step-{H.STEPS:08d}"


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), set(a) ^ set(b)
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.mark.parametrize(("name", "ref"), [("ddp", "llama"), ("fsdp", "llama"), ("zero3", "llama"), ("gpt2_fsdp", "gpt2"), ("gpt2_zero3", "gpt2"), ("lora_fsdp", "lora"), ("lora_ddp", "lora"), ("lora_zero3", "lora")])  # fmt: skip
def test_two_ranks_match_one_process_after_10_steps(
    runs: dict[str, Any], name: str, ref: str, tmp_path: Path
) -> None:
    """DDP, FSDP2 and ZeRO-3 land within 1e-5 of one process (GPT-2: dropout and biases;
    LoRA: instruction data, a different number of scored targets per sample)."""
    trained = _weights(_last(runs, name), tmp_path)
    reference = _weights(_last(runs, f"ref_{ref}"), tmp_path)
    if name == "lora_zero3":  # DeepSpeed's files add the frozen base: compare what trains
        trained = {k: v for k, v in trained.items() if k in reference}
    diff = _max_diff(trained, reference)
    assert diff <= TOL, f"{name}: max |Δw| {diff:.2e} vs one process after {H.STEPS} steps"
    logits = (runs["results"][name]["logits"] - runs["refs"][ref]["logits"]).abs().max()
    assert logits <= TOL, f"{name}: logits differ by {logits:.2e}"
    assert runs["results"][name]["summary"]["step"] == H.STEPS


@pytest.mark.parametrize("name", ["gpt2_fsdp", "gpt2_zero3"])
def test_tied_embeddings_stay_tied_through_sharding_and_export(
    runs: dict[str, Any], name: str, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from gpu_training.checkpoint.export_hf import export_hf

    state = _weights(_last(runs, name), tmp_path)
    assert torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    out = export_hf(_last(runs, name), tmp_path / "export")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True


@pytest.mark.parametrize("name", ["ddp", "fsdp", "zero3", "gpt2_fsdp"])
def test_export_hf_loads_with_from_pretrained_and_gives_the_trained_logits(
    runs: dict[str, Any], name: str, tmp_path: Path
) -> None:
    """Plain, DCP and DeepSpeed checkpoints: config, safetensors and tokenizer, same logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gpu_training.cli import main

    out = tmp_path / "export"
    assert main(["ckpt", "export-hf", str(_last(runs, name).parent), str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        logits = model(H.PROBE).logits
    diff = (logits - runs["results"][name]["logits"]).abs().max().item()
    assert diff <= 1e-6, f"{name}: exported logits differ from the trained model's by {diff:.2e}"
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert (
        tokenizer("In the beginning")["input_ids"]
        == AutoTokenizer.from_pretrained(H.TOKENIZER)("In the beginning")["input_ids"]
    )


def test_a_large_model_exports_in_shards(runs: dict[str, Any], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from gpu_training.checkpoint.export_hf import export_hf

    out = export_hf(_last(runs, "fsdp"), tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert torch.equal(model(H.PROBE).logits, runs["results"]["fsdp"]["logits"])


def test_stopped_run_resumes_bitwise_at_the_same_world_size(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """FSDP2 (DCP), LoRA under FSDP2 (adapters only in the checkpoint, the base refilled
    from the model on load) and LoRA under ZeRO-3: from step 5, mid-epoch."""
    for name in ("fsdp", "lora_fsdp", "lora_zero3"):
        assert runs["resumed"][name]["start_step"] == 5, name
        resumed = _weights(_last(runs, name), tmp_path)
        uninterrupted = _weights(Path(runs["root"]) / f"{name}-uninterrupted", tmp_path)
        assert resumed.keys() == uninterrupted.keys()
        same = [k for k in resumed if torch.equal(resumed[k], uninterrupted[k])]
        assert len(same) == len(resumed), f"{name}: resume is not exact"
        assert torch.equal(runs["resumed"][name]["logits"], runs["results"][name]["logits"])


def test_lora_trains_only_the_adapters_under_fsdp2_ddp_and_zero3(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """The frozen base does not move; checkpoints and optimizer state hold adapters only."""
    from torch.distributed.checkpoint import FileSystemReader

    for name in ("lora_fsdp", "lora_ddp", "lora_zero3"):
        assert runs["results"][name]["frozen_drift"] == 0.0, name
    for name in ("lora_fsdp", "lora_ddp", "lora_zero3"):
        state = _weights(_last(runs, name), tmp_path)
        assert state and all(".lora_A." in k or ".lora_B." in k for k in state), sorted(state)[:3]
        assert all(state[k].abs().max() > 0 for k in state if ".lora_B." in k)  # trained from 0
    keys = FileSystemReader(str(_last(runs, "lora_fsdp"))).read_metadata().state_dict_metadata
    optim = [k for k in keys if k.startswith("optim.state.")]
    assert optim and all(".lora_" in k for k in optim), optim[:3]
    plain = torch.load(_last(runs, "lora_ddp") / "state.pt", weights_only=True)
    assert len(plain["optimizer_state"]["state"]) == len(state)  # one entry per adapter


def test_lora_merged_export_is_base_plus_adapters(
    runs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from gpu_training.checkpoint.export_hf import BaseNameWarning, export_hf

    ckpt = _last(runs, "lora_fsdp")
    adapters = _weights(ckpt, tmp_path)
    merged = load_file(export_hf(ckpt, tmp_path / "merged") / "model.safetensors")
    base = load_file(Path(runs["assets"]["base"]) / "model.safetensors")
    assert merged.keys() == base.keys()
    scale = LORA["lora_alpha"] / LORA["r"]
    changed = 0
    for key, weight in base.items():
        module = key.removesuffix(".weight")
        a = adapters.get(f"base_model.model.{module}.lora_A.default.weight")
        if a is None:
            assert torch.equal(merged[key], weight), f"{key} changed without an adapter"
            continue
        b = adapters[f"base_model.model.{module}.lora_B.default.weight"]
        torch.testing.assert_close(merged[key], weight + scale * (b @ a), atol=1e-6, rtol=0)
        changed += 1
    assert changed == 2 * H.LLAMA["num_hidden_layers"]  # q_proj and v_proj of each layer
    trained = runs["results"]["lora_fsdp"]["logits"]
    with torch.no_grad():
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
        torch.testing.assert_close(model(H.PROBE).logits, trained, atol=1e-5, rtol=0)
        monkeypatch.chdir(tmp_path)  # the base lies elsewhere: named by its directory's name
        with pytest.warns(BaseNameWarning, match="give --base-name"):
            adapter_dir = export_hf(ckpt, tmp_path / "adapter", adapter=True)
        assert (adapter_dir / "adapter_config.json").is_file()
        base_model = AutoModelForCausalLM.from_pretrained(runs["assets"]["base"])
        peft = PeftModel.from_pretrained(base_model, adapter_dir).eval()
        torch.testing.assert_close(peft(H.PROBE).logits, trained, atol=1e-6, rtol=0)


def _adapter_base(adapter_dir: Path) -> str:
    """What the adapter names its base, checked to hold no absolute path of this machine."""
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert not [v for v in config.values() if isinstance(v, str) and Path(v).is_absolute()]
    base: str = config["base_model_name_or_path"]
    assert f"base_model: {base}\n" in (adapter_dir / "README.md").read_text()  # peft's card
    return base


def _holding(directory: Path, text: str) -> list[str]:
    return [p.name for p in directory.iterdir() if text.encode() in p.read_bytes()]


def test_a_lora_adapter_names_its_base_by_no_path_of_this_machine(
    runs: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The job gave the base as an absolute path: the adapter names it by its path relative to
    the current directory when it lies below (a copy loads from there, AutoPeftModel too), by
    its directory's name with a note otherwise, and as --base-name gives it."""
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    from gpu_training.cli import main

    root = Path(runs["root"])
    ckpt = str(_last(runs, "lora_ddp"))
    monkeypatch.chdir(tmp_path)  # the base lies elsewhere
    assert main(["ckpt", "export-hf", ckpt, "named", "--adapter"]) == 0
    note = capsys.readouterr().out.splitlines()[-1]
    assert note.startswith("note: adapter_config.json names the base 'base'"), note
    assert "--base-name" in note
    assert _adapter_base(tmp_path / "named") == "base"
    argv = ["ckpt", "export-hf", ckpt, "hub", "--adapter", "--base-name", "my-org/tiny-llama"]
    assert main(argv) == 0
    assert "note:" not in capsys.readouterr().out
    assert _adapter_base(tmp_path / "hub") == "my-org/tiny-llama"
    monkeypatch.chdir(root)  # the base lies below: assets/base
    assert main(["ckpt", "export-hf", ckpt, str(tmp_path / "here"), "--adapter"]) == 0
    assert "note:" not in capsys.readouterr().out
    assert _adapter_base(tmp_path / "here") == "assets/base"
    for name in ("named", "hub", "here"):  # nor anywhere else: the pytest directory's path
        assert not _holding(tmp_path / name, str(root.parent)), name

    trained = runs["results"]["lora_ddp"]["logits"]
    with torch.no_grad():
        base_model = AutoModelForCausalLM.from_pretrained(runs["assets"]["base"])
        before = PeftModel.from_pretrained(base_model, tmp_path / "here").eval()(H.PROBE).logits
        torch.testing.assert_close(before, trained, atol=1e-6, rtol=0)
        copied = H.copy_tree(tmp_path / "here", tmp_path / "another" / "machine")
        shutil.rmtree(tmp_path / "here")
        base_model = AutoModelForCausalLM.from_pretrained(runs["assets"]["base"])
        after = PeftModel.from_pretrained(base_model, copied).eval()(H.PROBE).logits
        assert torch.equal(after, before)
        auto = AutoPeftModelForCausalLM.from_pretrained(copied).eval()  # base: assets/base
        assert torch.equal(auto(H.PROBE).logits, before)


def test_a_lora_adapter_names_its_base_as_the_job_file_wrote_it(
    runs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``model_dir: models/base`` (relative, as in configs/hf/): the adapter says the same, and
    from the project's directory AutoPeftModel loads a copy of it with the trained logits."""
    from peft import AutoPeftModelForCausalLM

    from gpu_training.checkpoint.export_hf import export_hf

    project = tmp_path / "project"
    shutil.copytree(runs["assets"]["base"], project / "models" / "base")
    monkeypatch.chdir(project)
    options = H.task_options(
        runs["assets"],
        H.LLAMA,
        model_dir="models/base",
        train_files=[str(INSTRUCTIONS)],
        prompt_field="prompt",
        response_field="response",
        lora=LORA,
    )
    job = H.job(project / "run", options, {"name": "none"}, max_steps=2, warmup_steps=0)
    trained = H.train_one(job)["logits"]
    adapter = export_hf(project / "run" / "checkpoints", tmp_path / "adapter", adapter=True)
    assert _adapter_base(adapter) == "models/base"
    assert not _holding(adapter, str(tmp_path))
    copied = H.copy_tree(adapter, tmp_path / "copy" / "adapter")
    shutil.rmtree(adapter)
    with torch.no_grad():
        auto = AutoPeftModelForCausalLM.from_pretrained(copied).eval()
        torch.testing.assert_close(auto(H.PROBE).logits, trained, atol=1e-6, rtol=0)


def test_a_pretrained_model_from_an_import_string_trains_and_exports(tmp_path: Path) -> None:
    """``model: hf_models:gpt2`` with (inputs, targets) data and no loss: the default loss
    reads ``.logits``, the checkpoint carries the config, export-hf rebuilds the model."""
    from transformers import AutoModelForCausalLM

    from gpu_training.checkpoint.export_hf import export_hf
    from gpu_training.job import JobConfig
    from gpu_training.trainer import Trainer

    job = JobConfig.from_dict(
        {
            "task": {"model": "hf_models:gpt2", "data": "hf_models:windows"},
            "training": {"global_batch_size": 4, "per_device_batch_size": 4, "max_steps": 3},
            "strategy": {"name": "none"},
            "checkpoint": {"every": 3},
            "run": {"output_dir": str(tmp_path / "run"), "plot": False, "tensorboard": False},
        }
    )
    summary = Trainer(job, quiet=True).fit()
    assert summary["step"] == 3 and summary["train_loss"] < 5.0
    step_dir = tmp_path / "run" / "checkpoints" / "step-00000003"
    out = export_hf(step_dir, tmp_path / "export")
    model = AutoModelForCausalLM.from_pretrained(out)
    saved = _weights(step_dir, tmp_path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert not (out / "tokenizer.json").exists()  # none was given: none is invented
