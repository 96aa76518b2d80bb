"""Resume anywhere on Hugging Face causal LMs: another strategy and another world size.

The resume matrix (``tests/test_resume_matrix.py``) trains the toolkit's own model. Here the
models are transformers' own: GPT-2 with tied input/output embeddings and its default
dropout 0.1, and a Llama with a LoRA adapter (peft) on instruction data whose prompt tokens
are masked (-100). Each pair trains 10 steps at the source layout (checkpoints at 5 and 10),
loses its step-10 checkpoint (a kill after step 5), and resumes at the target layout; its
step-10 weights must be within 1e-5 of the uninterrupted run at the target layout (the figures
are in docs/checkpointing.md). ``make test`` runs the GPT-2 pairs (about 30 s on 2 cores);
the LoRA pairs are marked ``matrix`` (``make test-matrix``).
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


class _Runs:
    """Each model's runs, made the first time a test asks for that model: every layout of its
    pairs uninterrupted, then every pair resumed, one process group per world size each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.resumed: dict[str, Any] = {}
        self._done: set[str] = set()
        self._assets: dict[str, str] | None = None

    def of(self, model: str) -> Path:
        if model not in self._done:
            self._run(model)
            self._done.add(model)
        return self.root

    def _run(self, model: str) -> None:
        from gpu_training.tasks.hf import HFTaskOptions, hf_task

        if self._assets is None:
            self._assets = H.make_assets(self.root / "assets")
        assets = self._assets
        options = (H.gpt2_options if model == "gpt2" else H.lora_options)(assets)
        if model == "lora":
            hf_task(HFTaskOptions(**options)).build_data()  # the ranks read the cache
        pairs = [p for p in PAIRS if p[0] == model]
        layouts = {(s, r) for _, s1, r1, s2, r2 in pairs for s, r in ((s1, r1), (s2, r2))}
        for ranks in (1, 2):
            jobs = {
                _name(model, s, r): H.job(self.root / _name(model, s, r), options, STRATEGIES[s])
                for s, r in sorted(layouts)
                if r == ranks
            }
            run_ranks(H.train_jobs, ranks, args=(jobs,), timeout=900)
        resumes: dict[int, dict[str, Any]] = {1: {}, 2: {}}
        for _, source, n_source, target, n_target in pairs:
            name = f"{_name(model, source, n_source)}-to-{_name(model, target, n_target)}"
            out = self.root / name
            shutil.copytree(self.root / _name(model, source, n_source), out)
            shutil.rmtree(out / "checkpoints" / f"step-{H.STEPS:08d}")  # killed after step 5
            resumes[n_target][name] = H.job(out, options, STRATEGIES[target])
        for ranks, jobs in resumes.items():  # fresh processes: nothing in memory from the runs
            if jobs:
                self.resumed.update(run_ranks(H.train_jobs, ranks, args=(jobs,), timeout=900)[0])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> _Runs:
    pytest.importorskip("deepspeed")
    return _Runs(tmp_path_factory.mktemp("hf-anywhere"))


def _marks(model: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.matrix] if model == "lora" else []


def _weights(step_dir: Path, out: Path) -> dict[str, torch.Tensor]:
    from gpu_training.checkpoint import consolidate

    return torch.load(consolidate(step_dir, out, overwrite=True), weights_only=True)


@pytest.mark.parametrize(
    ("model", "source", "n_source", "target", "n_target"),
    [
        pytest.param(*p, id=f"{p[0]}-{p[1]}x{p[2]}-to-{p[3]}x{p[4]}", marks=_marks(p[0]))
        for p in PAIRS
    ],
)
def test_a_hf_model_resumes_under_another_strategy_and_world_size(
    runs: _Runs, model: str, source: str, n_source: int, target: str, n_target: int
) -> None:
    root = runs.of(model)
    name = f"{_name(model, source, n_source)}-to-{_name(model, target, n_target)}"
    assert runs.resumed[name]["start_step"] == 5  # resumed, not started afresh
    last = f"step-{H.STEPS:08d}"
    got = _weights(root / name / "checkpoints" / last, root / f"{name}.pt")
    want = _weights(
        root / _name(model, target, n_target) / "checkpoints" / last, root / f"{name}-ref.pt"
    )
    assert got.keys() == want.keys()
    worst = max((got[k].double() - want[k].double()).abs().max().item() for k in got)
    print(f"{name}: max |resumed - uninterrupted| = {worst:.2e}")
    assert worst <= TOL
