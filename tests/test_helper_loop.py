"""Promise 1 in the guides' own loop: ``train_one_epoch`` keeps what the Trainer keeps.

A user who writes the README's loop (``make_distributed_sampler`` with a global batch,
``MixedPrecisionStepper``, ``train_one_epoch``) trains the same weights on 1 rank x 4
micro-steps, 2 x 2 and 4 x 1, with dropout 0.1 and targets masked to a different length in
every sample (tests/masked_task.py), within 1e-5 after 20 AdamW steps, and a run stopped
after 10 and resumed on another rank count from the sampler's state ends there too.

The negative controls show what that needs: the loop as it was (dropout from each rank's
own stream, each micro-batch's mean loss) and a mean loss in today's loop both break it.
What a ``DistributedSampler`` keeps is measured too, as docs/foundation.md states it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dist_harness import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.slow, pytest.mark.timeout(300)]

TOL = 1e-5
STEPS = 20
GLOBAL = 16
PER_DEVICE = 4


def _mean_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The micro-batch's mean over its scored targets: what most hand loops write."""
    return torch.nn.functional.cross_entropy(
        outputs.reshape(-1, outputs.size(-1)), targets.reshape(-1), ignore_index=-100
    )


def _old_epoch(model: Any, loader: Any, stepper: Any, ctx: Any, max_steps: int) -> None:
    """``train_one_epoch`` before issue 30: dropout from the rank's stream, a mean per
    micro-batch. Kept here, as the negative control, in the fewest lines that do it."""
    from gpu_training.ddp import gradient_sync
    from gpu_training.rng import seed_everything

    seed_everything(0, rank=ctx.rank)  # the guide's "seed per rank"
    loader.batch_sampler.set_epoch(0)
    steps = 0
    for micro, (inputs, targets) in enumerate(loader):
        boundary = (micro + 1) % stepper.grad_accum_steps == 0
        with gradient_sync(model, enabled=boundary):
            stepper.backward(_mean_loss(model(inputs), targets))
        if stepper.step_async(model.parameters(), micro) is not None:
            steps += 1
            if steps == max_steps:
                return


def _helper_run(
    loop: str,
    loss: str,
    dropout: float,
    masked: bool,
    sampler_kind: str,
    per_device: int,
    stage: str,
    state_path: str,
) -> dict[str, torch.Tensor] | dict[str, float]:
    """The README's loop on this rank; rank 0 returns the weights after ``STEPS`` steps.

    ``stage`` "first" trains half of them and saves (rank 0) model, optimizer and sampler
    state to ``state_path``; "second" loads it and trains the other half."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    import masked_task
    from gpu_training.amp import MixedPrecisionStepper
    from gpu_training.ddp import (
        cleanup_distributed,
        init_distributed,
        make_distributed_sampler,
        train_one_epoch,
        unwrap_model,
    )
    from gpu_training.rng import seed_everything
    from gpu_training.tasks import cross_entropy_sum
    from gpu_training.tasks.charlm import build_datasets

    ctx = init_distributed()
    try:
        seed_everything(0)
        model = masked_task.model(dropout=dropout)
        if ctx.is_distributed:
            model = DDP(model)
        train = (
            masked_task.data()[0] if masked else build_datasets(block_size=masked_task.BLOCK).train
        )
        if sampler_kind == "global":
            sampler: Any = make_distributed_sampler(
                train, ctx, seed=0, global_batch_size=GLOBAL, per_device_batch_size=per_device
            )
            loader = DataLoader(train, batch_sampler=sampler)
            accum = sampler.gradient_accumulation_steps
        else:  # a DistributedSampler, also in one process (None would shuffle another way)
            sampler = torch.utils.data.DistributedSampler(
                train, ctx.world_size, ctx.rank, shuffle=True, seed=0, drop_last=True
            )
            loader = DataLoader(train, batch_size=per_device, sampler=sampler, drop_last=True)
            accum = GLOBAL // (per_device * ctx.world_size)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        stepper = MixedPrecisionStepper(
            optimizer, "fp32", grad_accum_steps=accum, max_grad_norm=1.0
        )
        loss_fn = cross_entropy_sum if loss == "sum" else _mean_loss
        steps = STEPS // 2 if stage else STEPS
        if stage == "second":
            state = torch.load(state_path, weights_only=True)
            unwrap_model(model).load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            sampler.load_state_dict(state["sampler"])
        if loop == "old":
            _old_epoch(model, loader, stepper, ctx, steps)
            metrics = {"steps": float(steps)}
        else:
            metrics = train_one_epoch(
                model, loader, stepper, loss_fn, ctx, epoch=0, max_steps=steps
            )
        assert metrics["steps"] == steps, metrics
        if stage == "first" and ctx.is_main_process:
            torch.save(
                {
                    "model": unwrap_model(model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "sampler": sampler.state_dict(),
                },
                state_path,
            )
        if loop == "metrics":
            return metrics
        return {k: v.detach().clone() for k, v in unwrap_model(model).state_dict().items()}
    finally:
        cleanup_distributed()


def _run(
    nproc: int,
    *,
    loop: str = "new",
    loss: str = "sum",
    dropout: float = 0.1,
    masked: bool = True,
    sampler: str = "global",
    per_device: int = PER_DEVICE,
    stage: str = "",
    state_path: str = "",
) -> Any:
    args = (loop, loss, dropout, masked, sampler, per_device, stage, state_path)
    return run_ranks(_helper_run, nproc, args=args, timeout=180)[0]


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    """1 rank x 4 micro-steps, dropout 0.1, masked targets, (sum, count) loss."""
    return _run(1)


@pytest.mark.parametrize("nproc", [2, 4])
def test_dropout_and_masked_targets_give_the_same_weights_on_any_split(
    reference: dict[str, torch.Tensor], nproc: int
) -> None:
    diff = _diff(reference, _run(nproc))
    assert diff <= TOL, f"1 x 4 vs {nproc} x {4 // nproc}: weights differ by {diff:.2e}"


def test_the_old_loop_breaks_the_parity() -> None:
    """Negative control: per-rank dropout streams and micro-batch means (the loop as it was)."""
    old = _diff(_run(1, loop="old", loss="mean"), _run(2, loop="old", loss="mean"))
    assert old > 100 * TOL, f"the old loop should differ between 1 and 2 ranks, got {old:.2e}"


def test_masked_targets_hold_when_the_per_device_batch_changes_too() -> None:
    """One global batch of 16 as 1 x 16 x 1 and 2 x 4 x 2 (no dropout: its masks follow the
    micro-batch): the (sum, count) loss holds, a micro-batch mean does not."""
    one = dict(dropout=0.0, per_device=16)
    two = dict(dropout=0.0, per_device=4)
    summed = _diff(_run(1, **one), _run(2, **two))
    assert summed <= TOL, f"(sum, count) over the global batch should hold, got {summed:.2e}"
    meaned = _diff(_run(1, loss="mean", **one), _run(2, loss="mean", **two))
    assert meaned > 100 * TOL, f"a mean over masked targets should differ, got {meaned:.2e}"


def test_a_mean_loss_keeps_working() -> None:
    """A user's mean-reducing loss trains as before, exact when every sample scores the same
    number of targets (unmasked data), dropout included."""
    one = dict(loss="mean", dropout=0.1, masked=False)
    exact = _diff(_run(1, **one), _run(4, **one))
    assert exact <= TOL, f"a mean loss on unmasked data should hold, got {exact:.2e}"


def test_what_a_distributed_sampler_keeps() -> None:
    """docs/foundation.md: with a DistributedSampler each step sees the same samples on 2 or 4
    ranks (so masked targets hold without dropout), but micro-batch k holds other samples,
    so dropout masks land on other samples."""
    plain = dict(sampler="distributed", dropout=0.0)
    same = _diff(_run(2, **plain), _run(4, **plain))
    assert same <= TOL, f"no dropout: the same samples per step, got {same:.2e}"
    noisy = dict(sampler="distributed", dropout=0.1)
    differs = _diff(_run(2, **noisy), _run(4, **noisy))
    assert differs > 100 * TOL, f"dropout regroups with a DistributedSampler, got {differs:.2e}"


def test_the_loss_metric_is_the_global_batch_loss_on_any_split() -> None:
    """The reported loss is the mean of the steps' global-batch losses: the same on 1 and 2
    ranks with masked targets (a mean of micro-batch means would not be)."""
    one, two = _run(1, loop="metrics"), _run(2, loop="metrics")
    assert abs(one["loss"] - two["loss"]) < 1e-5, (one, two)
    assert one["samples"] == 2 * two["samples"] == STEPS * GLOBAL


@pytest.mark.parametrize("first, second", [(2, 4), (4, 1)])
def test_a_run_resumed_at_another_rank_count_continues_the_same_masks(
    reference: dict[str, torch.Tensor], tmp_path: Path, first: int, second: int
) -> None:
    """Promise 2 in the helper loop: 10 steps on ``first`` ranks, the sampler's state saved
    with the model, 10 more on ``second``: the same weights as 20 uninterrupted steps (the
    streams' key comes from the sampler's position, so dropout continues where it was)."""
    state = str(tmp_path / "state.pt")
    _run(first, stage="first", state_path=state)
    diff = _diff(reference, _run(second, stage="second", state_path=state))
    assert diff <= TOL, f"{first} ranks then {second}: weights differ by {diff:.2e}"
