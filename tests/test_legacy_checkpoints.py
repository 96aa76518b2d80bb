"""Checkpoints written before the checkpoint redesign still load, and a plain one resumes exactly.

``tests/fixtures/legacy_checkpoints/`` holds step-2 checkpoints of a tiny job in each format
(plain, DCP, DeepSpeed), written by commit 294f6d8 with ``make.py`` there, and the model
weights that commit had at steps 2 and 4. The code of today must read every one of them and,
resuming the plain one, end bit for bit where that commit's uninterrupted run ended.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from gpu_training.checkpoint import (
    CheckpointManager,
    consolidate,
    find_resumable,
    verify_checkpoints,
)
from gpu_training.ddp import DistributedContext
from gpu_training.job import JobConfig
from gpu_training.reporting import read_metrics
from gpu_training.tasks import build_task

FIXTURES = Path(__file__).parent / "fixtures" / "legacy_checkpoints"
FORMATS = {"none": "torch", "fsdp": "dcp", "deepspeed": "deepspeed"}


def _fixture(strategy: str, tmp_path: Path) -> tuple[dict, Path, dict[str, dict]]:
    """The job, a copy of the checkpoint root holding step 2, and the expected weights."""
    source = FIXTURES / strategy
    job = yaml.safe_load((source / "job.yaml").read_text())
    root = tmp_path / "run" / "checkpoints"
    shutil.copytree(source / "step-00000002", root / "step-00000002")
    expected = torch.load(source / "expected.pt", weights_only=True)
    return job, root, expected


_ROUNDING = 2e-6
"""How far another CPU's rounding may move the resumed step 4 from the fixture's: 7e-8 seen on an
AVX-512 EPYC, where a resume that loses the optimizer's moments lands 5.7e-3 away."""


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def _equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return sorted(got) == sorted(want) and all(torch.equal(got[k], v) for k, v in want.items())


@pytest.mark.parametrize("strategy", sorted(FORMATS))
def test_a_checkpoint_from_before_the_redesign_verifies_and_consolidates(
    strategy: str, tmp_path: Path
) -> None:
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    _, root, expected = _fixture(strategy, tmp_path)
    step_dir = root / "step-00000002"
    assert verify_checkpoints(root) == {step_dir: []}
    assert find_resumable(root).latest == step_dir
    assert CheckpointManager(root, ctx=DistributedContext()).manifest(2)["step"] == 2
    out = consolidate(step_dir, tmp_path / "model.pt")
    _assert_same(torch.load(out, weights_only=True), expected["model_step2"])


def test_a_sharded_checkpoint_from_before_loads_into_a_plain_model_with_its_run_state(
    tmp_path: Path,
) -> None:
    job, root, expected = _fixture("fsdp", tmp_path)
    model = build_task(JobConfig.from_dict(job)).build_model()
    optimizer = torch.optim.AdamW(model.parameters())
    extra = CheckpointManager(root, ctx=DistributedContext()).load_sharded(model, optimizer)
    _assert_same(model.state_dict(), expected["model_step2"])
    assert extra["step"] == 2 and extra["world_size"] == 2
    assert {"scheduler_state", "sampler_state", "rng_states", "trackers"} <= set(extra)
    assert optimizer.state_dict()["state"], "the optimizer's moments came back"


def test_a_plain_checkpoint_from_before_resumes_to_the_same_weights_bit_for_bit(
    tmp_path: Path,
) -> None:
    from gpu_training.trainer import Trainer

    job, root, expected = _fixture("none", tmp_path)
    job["run"]["output_dir"] = str(tmp_path / "run")
    summary = Trainer(JobConfig.from_dict(job), quiet=True).fit()
    assert int(summary["step"]) == 4
    # it resumed (a fresh start would reach the same weights too: the run is deterministic)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    trained = [row["step"] for row in rows if row["split"] == "train"]
    assert trained == [3, 4], trained
    resumed = CheckpointManager(root, ctx=DistributedContext()).load(4)["model_state"]
    if _equal(resumed, expected["model_step4"]):
        return
    # Bit for bit holds only on a CPU whose kernels round as the one that wrote the fixture did
    # (an AVX-512 EPYC does not round as it). There, today's uninterrupted run does not reach
    # the fixture's step 2 either, and the resumed weights are the fixture's to float rounding.
    job["run"]["output_dir"] = str(tmp_path / "fresh")
    job["training"]["max_steps"] = 2
    Trainer(JobConfig.from_dict(job), quiet=True).fit()
    fresh_root = tmp_path / "fresh" / "checkpoints"
    fresh = CheckpointManager(fresh_root, ctx=DistributedContext()).load(2)["model_state"]
    assert not _equal(fresh, expected["model_step2"]), "this CPU rounds as the fixture's did"
    for key, value in expected["model_step4"].items():
        torch.testing.assert_close(resumed[key], value, rtol=0, atol=_ROUNDING, msg=key)
