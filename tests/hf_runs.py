"""Shared pieces of the Hugging Face tests: tiny models, local files, and the rank worker.

Everything is local: the tokenizer is the byte-level BPE shipped in ``configs/hf/tokenizer``
(512 ids, trained on the package's corpus), the text is the first 60 KB of that corpus, the
models are Llama and GPT-2 built from config dictionaries (2 layers, width 32), and the LoRA
base is such a Llama saved with ``save_pretrained`` by :func:`make_assets`.

:func:`train_jobs` is the rank worker (``run_ranks``): it trains several jobs one after the
other in one process group — every process start costs seconds of imports on 2 cores — and
reports, per job, the trained model's logits on a probe batch and how far the frozen
parameters moved.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import torch

from dist_harness import REPO_ROOT

TOKENIZER = REPO_ROOT / "configs" / "hf" / "tokenizer"
CORPUS = REPO_ROOT / "src" / "gpu_training" / "tasks" / "data" / "kjv_selections.txt"
INSTRUCTIONS = REPO_ROOT / "configs" / "hf" / "instructions.jsonl"
LORA: dict[str, Any] = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
STEPS = 10

LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
GPT2: dict[str, Any] = {
    "model_type": "gpt2",
    "vocab_size": 512,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 2,
    "n_positions": 64,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
"""Tied input and output embeddings (GPT-2's default), dropout 0.1 (its default too)."""

PROBE = torch.arange(2 * 24).reshape(2, 24) * 7 % 512
"""Token ids the trained and the exported models are both run on."""


def make_assets(root: Path) -> dict[str, str]:
    """The corpus, a token cache filled by this process, and a saved LoRA base under ``root``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from gpu_training.tasks.hf import HFTaskOptions, hf_task

    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.txt"
    corpus.write_text(CORPUS.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    base = root / "base"
    torch.manual_seed(11)
    shape = {k: v for k, v in LLAMA.items() if k != "model_type"}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **shape))
    model.save_pretrained(base)
    AutoTokenizer.from_pretrained(TOKENIZER).save_pretrained(base)
    assets = {"corpus": str(corpus), "cache": str(root / "cache"), "base": str(base)}
    # Tokenized here, once: the ranks find the cache (as after `train`'s preflight).
    hf_task(HFTaskOptions(**task_options(assets, LLAMA))).build_data()
    return assets


def task_options(assets: dict[str, str], config: dict[str, Any], **more: Any) -> dict[str, Any]:
    """``task_options`` of an ``hf`` job on the test corpus."""
    options: dict[str, Any] = {
        "config": dict(config),
        "tokenizer": str(TOKENIZER),
        "train_files": [assets["corpus"]],
        "block_size": 32,
        "cache_dir": assets["cache"],
    }
    if "model_dir" in more:
        options.pop("config")
        options.pop("tokenizer")
    options.update(more)
    return options


def gpt2_options(assets: dict[str, str]) -> dict[str, Any]:
    """GPT-2 (tied embeddings, dropout 0.1) with eager attention, on the test corpus."""
    return task_options(assets, GPT2, attn_implementation="eager")


def lora_options(assets: dict[str, str]) -> dict[str, Any]:
    """LoRA over the saved Llama base, on instruction data whose prompt tokens are masked."""
    return task_options(
        assets,
        LLAMA,
        model_dir=assets["base"],
        train_files=[str(INSTRUCTIONS)],
        prompt_field="prompt",
        response_field="response",
        lora=LORA,
    )


def job(
    out: Path, options: dict[str, Any], strategy: dict[str, Any], **training: Any
) -> dict[str, Any]:
    """A 10-step job: global batch 8 (1 x 4 x 2 or 2 x 4 x 1), fp32, checkpoints at 5 and 10."""
    return {
        "task": "hf",
        "task_options": copy.deepcopy(options),
        "training": {
            "global_batch_size": 8,
            "per_device_batch_size": 4,
            "learning_rate": 3e-3,
            "warmup_steps": 2,
            "max_steps": STEPS,
            "precision": "fp32",
            "seed": 5,
            **training,
        },
        "strategy": strategy,
        "checkpoint": {"every": 5, "keep_last_n": 3},
        "run": {
            "output_dir": str(out),
            "log_every": 5,
            "eval_every": 10,
            "eval_batches": 1,
            "plot": False,
            "tensorboard": False,
            "progress": False,
        },
    }


def _full(p: torch.Tensor) -> torch.Tensor:
    """The whole parameter on every rank (a collective for sharded ones: call it on all)."""
    if hasattr(p, "ds_id"):  # a ZeRO-3 partition
        import deepspeed

        with deepspeed.zero.GatheredParameters([p]):
            return p.detach().cpu().clone()
    full = p.full_tensor() if hasattr(p, "full_tensor") else p  # an FSDP2 shard
    return full.detach().cpu().clone()


def train_one(data: dict[str, Any]) -> dict[str, Any]:
    """Trains one job in the current process (group); logits and frozen-parameter drift."""
    from gpu_training.job import JobConfig
    from gpu_training.tasks import build_task
    from gpu_training.trainer import Trainer

    job_config = JobConfig.from_dict(data)
    task = build_task(job_config)
    kept: dict[str, Any] = {}
    make = task.build_model

    def build_model() -> torch.nn.Module:
        model = make()
        kept["model"] = model  # wrapping changes it in place (FSDP2) or holds it (DDP, ZeRO)
        kept["frozen"] = {
            n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad
        }
        return model

    class _StartStep:
        def on_train_start(self, trainer: Any) -> None:
            kept["start_step"] = trainer.state.step  # > 0: resumed from a checkpoint

    task.build_model = build_model
    summary = Trainer(job_config, task=task, quiet=True, callbacks=[_StartStep()]).fit()
    model = kept["model"].eval()
    frozen_drift = 0.0
    if kept["frozen"]:
        now = {n: p for n, p in model.named_parameters() if not p.requires_grad}
        for name, before in kept["frozen"].items():
            frozen_drift = max(frozen_drift, (_full(now[name]) - before).abs().max().item())
    with torch.no_grad():
        logits = model(PROBE).logits.detach().cpu()
    return {
        "summary": summary,
        "logits": logits,
        "frozen_drift": frozen_drift,
        "start_step": kept["start_step"],
    }


def train_jobs(jobs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rank worker: trains each job in turn in one process group (rank 0 returns the results)."""
    from gpu_training.ddp import cleanup_distributed, init_distributed

    init_distributed()
    try:
        return {name: train_one(data) for name, data in jobs.items()}
    finally:
        cleanup_distributed()


def copy_tree(src: Path, dst: Path) -> Path:
    """``shutil.copytree`` that returns ``dst``."""
    shutil.copytree(src, dst)
    return dst
