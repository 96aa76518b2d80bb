"""Resume anywhere on Hugging Face causal LMs: another strategy and another world size.

The resume matrix (``tests/test_resume_matrix.py``) trains the toolkit's own model. Here the
models are transformers' own: GPT-2 with tied input/output embeddings and its default
dropout 0.1, and a Llama with a LoRA adapter (peft) on instruction data whose prompt tokens
are masked (-100). Each pair trains 10 steps at the source layout (checkpoints at 5 and 10),
loses its step-10 checkpoint (a kill after step 5), and resumes at the target layout; its
step-10 weights must be within 1e-5 of the uninterrupted run at the target layout (about a
minute on 2 cores; the figures are in docs/checkpointing.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import hf_runs as H
from dist_harness import run_ranks

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
]

TOL = 1e-5
STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {"name": "ddp"},
    "fsdp": {"name": "fsdp"},
    "zero2": {"name": "deepspeed", "zero_stage": 2},
    "zero3": {"name": "deepspeed", "zero_stage": 3},
}
PAIRS = [  # (model, source strategy, its ranks, target strategy, its ranks)
    ("gpt2", "ddp", 2, "zero3", 2),
    ("gpt2", "zero3", 2, "fsdp", 1),
    ("gpt2", "fsdp", 2, "ddp", 1),
    ("lora", "fsdp", 2, "zero3", 2),
    ("lora", "zero3", 2, "ddp", 1),
    ("lora", "zero2", 2, "fsdp", 2),
]


def _name(model: str, strategy: str, ranks: int) -> str:
    return f"{model}-{strategy}x{ranks}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from gpu_training.tasks.hf import HFTaskOptions, hf_task

    pytest.importorskip("deepspeed")
    root = tmp_path_factory.mktemp("hf-anywhere")
    assets = H.make_assets(root / "assets")
    options = {"gpt2": H.gpt2_options(assets), "lora": H.lora_options(assets)}
    hf_task(HFTaskOptions(**options["lora"])).build_data()  # the ranks read the cache
    layouts = {(m, s, r) for m, s1, r1, s2, r2 in PAIRS for s, r in ((s1, r1), (s2, r2))}
    for ranks in (1, 2):  # every layout uninterrupted, one process group per world size
        jobs = {
            _name(m, s, r): H.job(root / _name(m, s, r), options[m], STRATEGIES[s])
            for m, s, r in sorted(layouts)
            if r == ranks
        }
        run_ranks(H.train_jobs, ranks, args=(jobs,), timeout=900)
    resumes: dict[int, dict[str, Any]] = {1: {}, 2: {}}
    for model, source, n_source, target, n_target in PAIRS:
        name = f"{_name(model, source, n_source)}-to-{_name(model, target, n_target)}"
        out = root / name
        shutil.copytree(root / _name(model, source, n_source), out)
        shutil.rmtree(out / "checkpoints" / f"step-{H.STEPS:08d}")  # killed after step 5
        resumes[n_target][name] = H.job(out, options[model], STRATEGIES[target])
    resumed: dict[str, Any] = {}
    for ranks, jobs in resumes.items():  # fresh processes: nothing in memory from the runs
        resumed.update(run_ranks(H.train_jobs, ranks, args=(jobs,), timeout=900)[0])
    return {"root": root, "resumed": resumed}


def _weights(step_dir: Path, out: Path) -> dict[str, torch.Tensor]:
    from gpu_training.checkpoint import consolidate

    return torch.load(consolidate(step_dir, out, overwrite=True), weights_only=True)


@pytest.mark.parametrize(
    ("model", "source", "n_source", "target", "n_target"),
    PAIRS,
    ids=[f"{m}-{s}x{a}-to-{t}x{b}" for m, s, a, t, b in PAIRS],
)
def test_a_hf_model_resumes_under_another_strategy_and_world_size(
    runs: dict[str, Any], model: str, source: str, n_source: int, target: str, n_target: int
) -> None:
    root = Path(runs["root"])
    name = f"{_name(model, source, n_source)}-to-{_name(model, target, n_target)}"
    assert runs["resumed"][name]["start_step"] == 5  # resumed, not started afresh
    last = f"step-{H.STEPS:08d}"
    got = _weights(root / name / "checkpoints" / last, root / f"{name}.pt")
    want = _weights(
        root / _name(model, target, n_target) / "checkpoints" / last, root / f"{name}-ref.pt"
    )
    assert got.keys() == want.keys()
    worst = max((got[k].double() - want[k].double()).abs().max().item() for k in got)
    print(f"{name}: max |resumed - uninterrupted| = {worst:.2e}")
    assert worst <= TOL
