"""Promise 1 without fine print: the same weights on any split of the global batch.

Each case trains the same job with ``gpu-training train`` on 1, 2 and 4 CPU ranks (gloo; the
ranks forked from the test harness's zygote: tests/train_jobs.py) and compares the final
weights tensor by tensor:

- dropout 0.1 on a bias-free model (a zero-gradient key bias amplifies rounding under AdamW:
  see docs/strategies.md), 1 x 4 / 2 x 2 / 4 x 1, within 1e-5 after 20 steps, and the
  validation loss equal on 1, 2 and 4 ranks; the same under FSDP2 and ZeRO-2; activation
  checkpointing sees the same masks;
- a run with dropout resumed at another world size ends where the uninterrupted one does;
- targets that mask a different number of positions per sample, over one global batch of
  16 split as 1 x 16, 2 x 4 x 2 accumulation and 4 x 2 x 2.

The negative controls run the same pieces in a hand loop (``train_step``): per-rank seeding
and a per-micro-batch mean over masked targets must break the parity these tests assert.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dist_harness import run_ranks
from resume_jobs import JOB
from train_jobs import train

pytestmark = [pytest.mark.multirank, pytest.mark.slow, pytest.mark.timeout(400)]

TOL = 1e-5
STEPS = 20
_JOB: dict[str, Any] = {**JOB, "run": {**JOB["run"], "log_every": 10}}
"""resume_jobs's job (the same model, data and settings), logging every 10 steps."""


def _train(tmp: Path, name: str, nproc: int, **changes: Any) -> Path:
    job = json.loads(json.dumps(_JOB))
    for dotted, value in changes.items():
        section, field = dotted.split("__")
        if section == "task":  # a user task: its own options, none of charlm's
            job["task"], job["task_options"] = value, {}
            continue
        job.setdefault(section, {})[field] = value
    out = tmp / name
    job["run"]["output_dir"] = str(out)
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(job))
    train(tmp / f"{name}.yaml", nproc)
    return out


def _weights(out: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    step_dir = out / "checkpoints" / f"step-{step:08d}"
    if (step_dir / "state.pt").exists():
        return torch.load(step_dir / "state.pt", weights_only=True)["model_state"]
    from gpu_training.checkpoint import consolidate

    target = out / "weights.pt"
    consolidate(step_dir, target, overwrite=True)
    return torch.load(target, weights_only=True)


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _val_losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["split"] == "val"]


@pytest.fixture(scope="module")
def dropout_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("dropout")
    return {
        "1x4": _train(tmp, "w1", 1),
        "2x2": _train(tmp, "w2", 2),
        "4x1": _train(tmp, "w4", 4),
    }


def test_dropout_gives_the_same_weights_on_1_2_and_4_ranks(dropout_runs: dict[str, Path]) -> None:
    reference = _weights(dropout_runs["1x4"])
    for split in ("2x2", "4x1"):
        diff = _diff(reference, _weights(dropout_runs[split]))
        assert diff <= TOL, f"1x4 vs {split} differ by {diff:.2e} with dropout 0.1"


def test_the_default_model_holds_except_its_key_bias(tmp_path: Path) -> None:
    """``bias: true``: the key bias's gradient is zero in exact arithmetic, so AdamW turns
    rounding noise into updates there (docs/strategies.md); everything else holds to 1e-6."""
    runs = [_train(tmp_path, f"b{n}", n, task_options__bias=True) for n in (1, 4)]
    a, b = (_weights(out) for out in runs)
    width = _JOB["task_options"]["n_embd"]
    for name in a:
        d = (a[name] - b[name]).abs()
        if name.endswith("attn.c_attn.bias"):
            key = d[width : 2 * width]  # c_attn packs query, key, value
            assert torch.cat([d[:width], d[2 * width :]]).max() <= 1e-6, name
            assert key.max() <= 1e-4, f"{name} key slice drifted {key.max():.2e}"
        else:
            assert d.max() <= 1e-6, f"{name} differs by {d.max():.2e}"


def test_validation_loss_does_not_depend_on_the_rank_count(dropout_runs: dict[str, Path]) -> None:
    losses = {split: _val_losses(out) for split, out in dropout_runs.items()}
    assert len(losses["1x4"]) == 2
    for split in ("2x2", "4x1"):
        assert losses[split] == pytest.approx(losses["1x4"], abs=1e-6), losses


def test_activation_checkpointing_sees_the_same_masks(
    dropout_runs: dict[str, Path], tmp_path: Path
) -> None:
    out = _train(tmp_path, "ac", 2, strategy__activation_checkpointing=True)
    diff = _diff(_weights(dropout_runs["2x2"]), _weights(out))
    assert diff <= 1e-6, f"checkpointed blocks drew other masks: {diff:.2e}"


@pytest.mark.parametrize(
    "strategy",
    [
        {"name": "fsdp"},
        pytest.param(
            {"name": "deepspeed", "zero_stage": 2},
            marks=pytest.mark.skipif(find_spec("deepspeed") is None, reason="needs deepspeed"),
        ),
    ],
    ids=["fsdp2", "zero2"],
)
def test_dropout_parity_holds_under_sharded_strategies(
    dropout_runs: dict[str, Path], tmp_path: Path, strategy: dict[str, Any]
) -> None:
    out = _train(
        tmp_path,
        strategy["name"],
        2,
        strategy__name=strategy["name"],
        **({"strategy__zero_stage": strategy["zero_stage"]} if "zero_stage" in strategy else {}),
    )
    diff = _diff(_weights(dropout_runs["1x4"]), _weights(out))
    assert diff <= TOL, f"{strategy} vs one rank differ by {diff:.2e}"
    assert _val_losses(out) == pytest.approx(_val_losses(dropout_runs["1x4"]), abs=1e-6)


@pytest.mark.parametrize("nproc", [1, 4])
def test_a_dropout_run_resumes_exactly_at_another_world_size(
    dropout_runs: dict[str, Path], tmp_path: Path, nproc: int
) -> None:
    out = tmp_path / f"resumed{nproc}"
    shutil.copytree(dropout_runs["2x2"], out)
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS:08d}")  # stopped after step 10
    _train(tmp_path, f"resumed{nproc}", nproc)
    diff = _diff(_weights(dropout_runs["2x2"]), _weights(out))
    assert diff <= TOL, f"2 ranks -> {nproc} after step 10: {diff:.2e}"


def test_masked_targets_give_the_same_weights_on_any_split(tmp_path: Path) -> None:
    task = {"model": "masked_task:model", "data": "masked_task:data"}
    runs = {
        split: _train(
            tmp_path, f"m{nproc}", nproc, task__=task, training__per_device_batch_size=per_device
        )
        for split, nproc, per_device in (("1x16", 1, 16), ("2x4x2", 2, 4), ("4x2x2", 4, 2))
    }
    reference = _weights(runs["1x16"])
    for split in ("2x4x2", "4x2x2"):
        diff = _diff(reference, _weights(runs[split]))
        assert diff <= TOL, f"masked targets: 1x16 vs {split} differ by {diff:.2e}"


def test_uneven_validation_shards_do_not_hang_a_sharded_forward(tmp_path: Path) -> None:
    """9 validation samples on 2 ranks, 4 per batch: rank 0 has 2 batches, rank 1 one. FSDP's
    forward all-gathers, so rank 1 runs one unscored forward; the loss is still the 9's."""
    task = {"model": "masked_task:model", "data": "masked_task:data_small_val"}
    runs = [
        _train(
            tmp_path,
            f"v{n}",
            n,
            task__=task,
            strategy__name="fsdp" if n > 1 else "none",
            strategy__block_classes=["Block"],  # one block: nothing repeats to detect
            training__max_steps=2,
            run__eval_every=2,
            run__eval_batches=None,
        )
        for n in (1, 2)
    ]
    one, two = (_val_losses(out) for out in runs)
    assert len(one) == 1 and two == pytest.approx(one, abs=1e-6)


# --- negative controls: what the parity above needs ---------------------------------------------


def _hand_loop(old_seeding: bool, mean_loss: bool, per_device: int, dropout: float) -> Any:
    """A few steps of the real pieces (sampler, DDP, train_step) on this rank."""
    import torch.nn.functional as F

    import gpu_training.step as step_module
    import masked_task
    from gpu_training.config import TrainingConfig
    from gpu_training.data import GlobalBatchSampler
    from gpu_training.ddp import cleanup_distributed, init_distributed, unwrap_model
    from gpu_training.rng import seed_everything
    from gpu_training.strategy import prepare
    from gpu_training.tasks import cross_entropy_sum

    ctx = init_distributed()
    try:
        seed_everything(0)
        model = masked_task.model(dropout=dropout)
        train, _ = masked_task.data()
        cfg = TrainingConfig(
            global_batch_size=16,
            per_device_batch_size=per_device,
            world_size=ctx.world_size,
            learning_rate=3e-3,
            precision="fp32",
        )
        run = prepare(model, "ddp" if ctx.is_distributed else "none", ctx, cfg, device="cpu")
        sampler = GlobalBatchSampler(len(train), 16, per_device, ctx, seed=0)
        loader = torch.utils.data.DataLoader(train, batch_sampler=sampler)
        if old_seeding:  # the old path: per-rank streams, no per-micro-batch stream
            seed_everything(0, rank=ctx.rank)
            step_module.micro_batch_rng = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]

        def mean(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(outputs.reshape(-1, outputs.size(-1)), targets.reshape(-1))

        groups = step_module.step_batches(loader, sampler.gradient_accumulation_steps)
        for step, batches in zip(range(6), groups, strict=False):
            step_module.train_step(
                batches,
                run.model,
                mean if mean_loss else cross_entropy_sum,
                run.steps,
                ctx=ctx,
                device=torch.device("cpu"),
                seed=0,
                step=step,
            )
        return {k: v.detach().clone() for k, v in unwrap_model(run.model).state_dict().items()}
    finally:
        cleanup_distributed()


def _hand(
    nproc: int, *, old_seeding: bool, mean_loss: bool, per_device: int, dropout: float
) -> dict[str, torch.Tensor]:
    args = (old_seeding, mean_loss, per_device, dropout)
    return run_ranks(_hand_loop, nproc, args=args, timeout=120)[0]


def test_negative_controls_break_the_parity() -> None:
    # dropout: the per-micro-batch stream keeps 1 and 2 ranks together; per-rank seeds do not
    same: dict[str, Any] = dict(mean_loss=False, per_device=4, dropout=0.1)
    assert _diff(_hand(1, old_seeding=False, **same), _hand(2, old_seeding=False, **same)) <= TOL
    old = _diff(_hand(1, old_seeding=True, **same), _hand(2, old_seeding=True, **same))
    assert old > 100 * TOL, f"per-rank seeding should differ, got {old:.2e}"
    # masks: sum over the global count keeps 1 x 16 and 2 x 4 x 2 together; a mean does not
    one: dict[str, Any] = dict(old_seeding=False, dropout=0.0)
    summed = _diff(
        _hand(1, mean_loss=False, per_device=16, **one),
        _hand(2, mean_loss=False, per_device=4, **one),
    )
    assert summed <= TOL, f"(sum, count) should match, got {summed:.2e}"
    meaned = _diff(
        _hand(1, mean_loss=True, per_device=16, **one),
        _hand(2, mean_loss=True, per_device=4, **one),
    )
    assert meaned > 100 * TOL, f"a micro-batch mean over masked targets should differ: {meaned:.2e}"
