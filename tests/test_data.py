"""gpu_training.data: global batches independent of world size, exact resume, clear errors.

Single-process tests simulate every rank with explicit ``DistributedContext`` objects (no
process group needed); the parity tests train for real on gloo ranks through ``run_ranks``.
"""

from __future__ import annotations

import io
import itertools
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from dist_harness import run_ranks
from gpu_training import data as data_module
from gpu_training.amp import MixedPrecisionTrainer
from gpu_training.data import GlobalBatchSampler, SamplerConfigError, global_batch_plan
from gpu_training.ddp import (
    DistributedContext,
    cleanup_distributed,
    init_distributed,
    train_one_epoch,
)

pytestmark = pytest.mark.timeout(120)

Steps = list[list[int]]  # one entry per global step: all ranks' indices, rank-major


def _ctx(rank: int, world_size: int) -> DistributedContext:
    return DistributedContext(
        rank=rank, local_rank=rank, world_size=world_size, local_world_size=world_size
    )


def _samplers(
    num_samples: int, global_batch: int, per_device: int, world_size: int, **kwargs: Any
) -> list[GlobalBatchSampler]:
    return [
        GlobalBatchSampler(num_samples, global_batch, per_device, _ctx(r, world_size), **kwargs)
        for r in range(world_size)
    ]


def _global_steps(samplers: list[GlobalBatchSampler]) -> Steps:
    """Iterates every rank's sampler once and regroups the micro-batches into global steps."""
    accum = samplers[0].gradient_accumulation_steps
    per_rank = [list(s) for s in samplers]
    lengths = {len(batches) for batches in per_rank}
    assert len(lengths) == 1, f"ranks yield different numbers of micro-batches: {lengths}"
    assert all(len(b) == samplers[0].per_device_batch_size for r in per_rank for b in r)
    steps = lengths.pop() // accum
    return [
        [i for batches in per_rank for b in batches[k * accum : (k + 1) * accum] for i in b]
        for k in range(steps)
    ]


# --- the sequence of global batches ------------------------------------------------------


SPLITS = [(1, 4), (2, 2), (4, 1)]  # (world size, accumulation steps) with B = 4, G = 16


@pytest.mark.parametrize("shuffle", [True, False])
def test_global_steps_are_identical_for_every_split(shuffle: bool) -> None:
    n, g = 70, 16
    runs: dict[tuple[int, int], Steps] = {}
    for world, accum in [*SPLITS, (2, 4), (2, 1)]:  # (2, 4): B = 2; (2, 1): B = 8
        per_device = g // (world * accum)
        samplers = _samplers(n, g, per_device, world, seed=3, shuffle=shuffle)
        samplers[0].set_epoch(1)
        for s in samplers[1:]:
            s.set_epoch(1)
        assert samplers[0].gradient_accumulation_steps == accum
        assert samplers[0].steps_per_epoch == n // g
        runs[(world, accum)] = _global_steps(samplers)
    reference = runs[(1, 4)]
    assert len(reference) == n // g
    for split, steps in runs.items():
        assert steps == reference, f"split {split} draws other global batches than 1 rank × 4"
    seen = [i for step in reference for i in step]
    assert all(len(set(step)) == g for step in reference), "ranks overlap within a step"
    assert len(set(seen)) == len(seen) == (n // g) * g, "a sample repeats within the epoch"
    assert set(seen) <= set(range(n))
    if not shuffle:  # dataset order, cut into global batches, the tail of 6 dropped
        assert seen == list(range(64))


@pytest.mark.parametrize("rows", [1, 40, 1 << 16])  # a chunk of 1 step, 2 steps, the epoch
def test_chunked_index_lists_give_the_same_micro_batches(
    monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    # The sampler turns its permutation into lists a chunk of steps at a time: any chunk
    # size, any world size, any resume position yields the micro-batches of one whole list.
    def batches(world: int, per_device: int, start: int) -> list[list[list[int]]]:
        out = []
        for s in _samplers(150, 16, per_device, world, seed=7):
            s.set_epoch(2)
            s.set_position(start)
            out.append(list(s))
        return out

    reference = {(w, b, p): batches(w, b, p) for w, b in [(1, 4), (2, 8), (4, 2)] for p in (0, 3)}
    monkeypatch.setattr(data_module, "_ROWS_PER_CHUNK", rows)
    for (world, per_device, start), expected in reference.items():
        assert batches(world, per_device, start) == expected, (world, per_device, start, rows)
    assert len(reference[(1, 4, 3)][0]) == (150 // 16 - 3) * 4  # resumed: the rest of the epoch


def test_rank_layout_is_rank_major() -> None:
    # 1 rank × 4 micro-steps and 4 ranks × 1 see the very same micro-batches of 4 samples.
    single = list(GlobalBatchSampler(32, 16, 4, _ctx(0, 1), seed=9))
    quad = [list(s) for s in _samplers(32, 16, 4, 4, seed=9)]
    for step in range(2):
        for r in range(4):
            assert quad[r][step] == single[step * 4 + r]


def test_epochs_and_seeds_change_the_order_and_nothing_else() -> None:
    def order(seed: int, epoch: int) -> list[int]:
        s = GlobalBatchSampler(64, 8, 8, _ctx(0, 1), seed=seed)
        s.set_epoch(epoch)
        return [i for b in s for i in b]

    assert order(0, 0) == order(0, 0), "same seed and epoch must give the same order"
    assert order(0, 0) != order(0, 1), "set_epoch must change the order"
    assert order(0, 0) != order(1, 0), "the seed must change the order"
    assert order(0, 1) != order(1, 0), "seed and epoch must not simply add up"
    # Private generator: the global RNG neither changes the order nor is consumed.
    torch.manual_seed(1)
    before = torch.get_rng_state()
    first = order(5, 2)
    assert torch.equal(torch.get_rng_state(), before), "iterating consumed the global RNG"
    torch.manual_seed(2)
    assert order(5, 2) == first


def test_dataloader_len_and_exact_position() -> None:
    n, g, b = 40, 8, 4  # A = 2, 5 steps
    sampler = GlobalBatchSampler(n, g, b, _ctx(0, 1), seed=4)
    loader = DataLoader(TensorDataset(torch.arange(n)), batch_sampler=sampler)
    assert len(loader) == len(sampler) == 10
    expected = list(sampler)
    positions = []
    for micro, (x,) in enumerate(loader):
        assert x.tolist() == expected[micro]
        positions.append(sampler.position)
    # A step counts when its last micro-batch is handed out (num_workers=0: no prefetch).
    assert positions == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5]


def test_iteration_rules_replay_resume_and_set_epoch() -> None:
    sampler = GlobalBatchSampler(24, 8, 4, _ctx(0, 1), seed=0)  # A = 2, 3 steps
    full = list(sampler)
    assert sampler.position == 3 and len(sampler) == 6
    assert list(sampler) == full, "a consumed epoch replays from step 0 without set_epoch"

    it = iter(sampler)
    taken = list(itertools.islice(it, 3))  # step 0 and half of step 1
    assert taken == full[:3] and sampler.position == 1
    assert len(sampler) == 4
    assert list(sampler) == full[2:], "an abandoned iteration resumes at its unfinished step"
    next(it, None)  # the detached old iterator must not move the position any more
    assert sampler.position == 3

    sampler.set_epoch(0)  # same epoch: position kept
    assert sampler.position == 3
    sampler.set_epoch(1)
    assert sampler.position == 0 and sampler.epoch == 1 and len(sampler) == 6
    assert list(sampler) != full

    sampler.set_position(2)  # what a loop with prefetching workers does before saving
    assert list(sampler) == _epoch_batches(24, 8, 4, epoch=1)[4:]
    sampler.position = 3  # restored end of epoch: yields nothing rather than repeating it
    assert len(sampler) == 0 and list(sampler) == []
    for bad in (-1, 4, 1.0, True):
        with pytest.raises(ValueError, match="position"):
            sampler.set_position(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epoch"):
        sampler.set_epoch(-1)


def _epoch_batches(n: int, g: int, b: int, *, epoch: int, seed: int = 0) -> list[list[int]]:
    s = GlobalBatchSampler(n, g, b, _ctx(0, 1), seed=seed)
    s.set_epoch(epoch)
    return list(s)


# --- resume ------------------------------------------------------------------------------


@pytest.mark.parametrize(("save_world", "load_world"), [(2, 1), (1, 2), (4, 2), (2, 2)])
def test_resume_mid_epoch_on_another_world_size(save_world: int, load_world: int) -> None:
    n, g, b, seed, done = 100, 16, 4, 21, 2  # 6 steps per epoch; stop after 2 of epoch 1
    reference = _samplers(n, g, b, 1, seed=seed)
    reference[0].set_epoch(1)
    uninterrupted = _global_steps(reference)

    saving = _samplers(n, g, b, save_world, seed=seed)
    accum = saving[0].gradient_accumulation_steps
    for s in saving:
        s.set_epoch(1)
        consumed = list(itertools.islice(iter(s), done * accum))
        assert len(consumed) == done * accum
    states = [s.state_dict() for s in saving]
    assert all(st == states[0] for st in states), "ranks must save the same sampler state"
    state = states[0]
    assert state["epoch"] == 1 and state["position"] == done
    assert all(type(v) is int for v in state.values())
    # It survives a weights_only checkpoint round trip (plain ints only).
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)

    loading = _samplers(n, g, b * save_world // load_world, load_world, seed=seed)
    for s in loading:
        s.load_state_dict(state)
        s.set_epoch(1)  # the training loop's usual call keeps the restored position
        assert len(s) == (6 - done) * s.gradient_accumulation_steps
    assert _global_steps(loading) == uninterrupted[done:]
    for s in [*loading, *reference]:  # and the next epoch continues in step too
        s.set_epoch(2)
    assert _global_steps(loading) == _global_steps(reference)


@pytest.mark.parametrize(
    ("field", "value"), [("num_samples", 99), ("global_batch_size", 32), ("seed", 3)]
)
def test_load_state_dict_names_the_mismatched_field(field: str, value: int) -> None:
    state = GlobalBatchSampler(100, 16, 4, _ctx(0, 1), seed=21).state_dict()
    state[field] = value
    target = GlobalBatchSampler(100, 16, 8, _ctx(1, 2), seed=21)
    mine = {"num_samples": 100, "global_batch_size": 16, "seed": 21}[field]
    with pytest.raises(ValueError, match=rf"{field} is {value} .* but {mine} here"):
        target.load_state_dict(state)


def test_load_state_dict_rejects_bad_states() -> None:
    sampler = GlobalBatchSampler(100, 16, 4, _ctx(0, 1), seed=1)
    good = sampler.state_dict()
    with pytest.raises(ValueError, match=r"shuffle is 0 .* but 1 here"):
        sampler.load_state_dict({**good, "shuffle": 0})
    with pytest.raises(ValueError, match="no 'position'"):
        sampler.load_state_dict({k: v for k, v in good.items() if k != "position"})
    with pytest.raises(ValueError, match=r"position must be in \[0, 6\], got 7"):
        sampler.load_state_dict({**good, "position": 7})
    legacy = {k: v for k, v in good.items() if k != "shuffle"}
    sampler.load_state_dict({**legacy, "epoch": 3, "position": 5})
    assert (sampler.epoch, sampler.position, len(sampler)) == (3, 5, 4)


# --- configuration errors ----------------------------------------------------------------


def test_split_error_names_numbers_and_real_fixes() -> None:
    with pytest.raises(SamplerConfigError) as info:
        global_batch_plan(100, per_device_batch_size=8, world_size=4)
    msg = str(info.value)
    assert "global batch 100 does not split into 4 ranks × per-device batch 8" in msg
    assert "32 samples per micro-step" in msg
    assert "global batch of 96 (3 accumulation steps) or 128 (4 accumulation steps)" in msg
    assert "per-device batch of 5 (5 accumulation steps)" in msg  # 100 = 4 × 5 × 5

    with pytest.raises(SamplerConfigError) as info:
        GlobalBatchSampler(1000, 100, 8, _ctx(2, 3))
    msg = str(info.value)
    assert "96" in msg and "120" in msg
    assert "no per-device batch works on 3 ranks (100 is not a multiple of 3)" in msg
    # Suggestions stay within the dataset: 48 > 40 samples is not offered.
    with pytest.raises(SamplerConfigError) as info:
        GlobalBatchSampler(40, 40, 8, _ctx(0, 6))
    msg = str(info.value)
    assert "global batch of 48" not in msg and "not a multiple of 6" in msg
    assert "global batch of 36 (per-device batch 6, 1 accumulation step)" in msg


def test_plan_and_value_errors() -> None:
    assert global_batch_plan(16, 4, 1) == 4
    assert global_batch_plan(16, 4, 4) == 1
    assert issubclass(SamplerConfigError, ValueError)
    with pytest.raises(SamplerConfigError, match=r"larger than the dataset \(50 samples\)"):
        GlobalBatchSampler(50, 64, 4, _ctx(0, 1))
    for name, args in {
        "num_samples": (0, 8, 4),
        "global_batch_size": (10, -8, 4),
        "per_device_batch_size": (10, 8, True),
    }.items():
        with pytest.raises(SamplerConfigError, match=f"{name} must be a positive integer"):
            GlobalBatchSampler(*args, ctx=_ctx(0, 1))
    with pytest.raises(SamplerConfigError, match="world_size must be a positive integer"):
        global_batch_plan(8, 4, 0)


def test_default_context_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    sampler = GlobalBatchSampler(32, 16, 4, seed=2)
    assert (sampler.rank, sampler.world_size, sampler.gradient_accumulation_steps) == (1, 2, 2)
    other = GlobalBatchSampler(32, 16, 4, _ctx(0, 2), seed=2)
    assert _global_steps([other, sampler]) == _global_steps(_samplers(32, 16, 16, 1, seed=2))


def test_train_one_epoch_sets_the_epoch_of_a_batch_sampler() -> None:
    sampler = GlobalBatchSampler(16, 8, 4, _ctx(0, 1))
    loader = DataLoader(_regression(16), batch_sampler=sampler)
    model = _mlp()
    trainer = MixedPrecisionTrainer(
        torch.optim.SGD(model.parameters(), lr=0.1), precision="fp32", grad_accum_steps=2
    )
    train_one_epoch(model, loader, trainer, nn.functional.mse_loss, _ctx(0, 1), epoch=3)
    assert sampler.epoch == 3


# --- multi-rank: the same weights on 1, 2 and 4 ranks -------------------------------------

GLOBAL, PER_DEVICE, SAMPLES, EPOCHS = 16, 4, 56, 2  # 3 global steps per epoch


def _regression(num_samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(num_samples, 6, generator=g)
    y = x @ torch.randn(6, 3, generator=g) + 0.1 * torch.randn(num_samples, 3, generator=g)
    return TensorDataset(x, y)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _train_worker(stop_at: tuple[int, int] | None, resume: dict[str, Any] | None) -> dict[str, Any]:
    """DDP + train_one_epoch over GlobalBatchSampler; optionally stop or resume mid-epoch."""
    import warnings

    ctx = init_distributed()
    try:
        dataset = _regression(SAMPLES)
        model = _mlp()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sampler = GlobalBatchSampler(len(dataset), GLOBAL, PER_DEVICE, ctx, seed=5)
        if resume is not None:
            model.load_state_dict(resume["model"])
            optimizer.load_state_dict(resume["optimizer"])
            sampler.load_state_dict(resume["sampler"])
        net = DDP(model) if ctx.is_distributed else model
        trainer = MixedPrecisionTrainer(
            optimizer, precision="fp32", grad_accum_steps=sampler.gradient_accumulation_steps
        )
        loader = DataLoader(dataset, batch_sampler=sampler)
        steps = []
        for epoch in range(sampler.epoch, EPOCHS):
            max_steps = stop_at[1] if stop_at is not None and epoch == stop_at[0] else None
            with warnings.catch_warnings():
                # train_one_epoch finds the batch_sampler's set_epoch: no "no sampler" warning.
                warnings.simplefilter("error")
                metrics = train_one_epoch(
                    net, loader, trainer, nn.functional.mse_loss, ctx, epoch=epoch,
                    max_steps=max_steps,
                )  # fmt: skip
            steps.append(int(metrics["steps"]))
            if max_steps is not None:
                break
        state = {
            "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "sampler": sampler.state_dict(),
        }
        del net  # drop DDP's reducer before the group goes (docs/design.md, "Traps")
        return {"accum": sampler.gradient_accumulation_steps, "steps": steps, "state": state}
    finally:
        cleanup_distributed()


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.multirank
def test_same_weights_on_1_2_and_4_ranks_and_resume_from_2_on_1() -> None:
    per_epoch = SAMPLES // GLOBAL
    finals = {}
    for world, accum in SPLITS:
        results = run_ranks(_train_worker, world, args=(None, None), timeout=90)
        for r in results:
            assert r["accum"] == accum
            assert r["steps"] == [per_epoch] * EPOCHS
            assert _max_diff(r["state"]["model"], results[0]["state"]["model"]) == 0.0
        finals[world] = results[0]["state"]["model"]
    init = _mlp().state_dict()
    assert _max_diff(finals[1], init) > 1e-2, "training did not move the weights"
    for world in (2, 4):
        diff = _max_diff(finals[world], finals[1])
        assert diff <= 1e-5, f"{world} ranks end {diff:.2e} away from 1 rank × 4 micro-steps"

    # Stop 2 ranks after epoch 0 and one step of epoch 1; finish on 1 rank × 4 micro-steps.
    stopped = run_ranks(_train_worker, 2, args=((1, 1), None), timeout=90)
    assert stopped[0]["steps"] == [per_epoch, 1]
    assert stopped[0]["state"]["sampler"]["epoch"] == 1
    assert stopped[0]["state"]["sampler"]["position"] == 1
    (resumed,) = run_ranks(_train_worker, 1, args=(None, stopped[0]["state"]), timeout=90)
    assert resumed["steps"] == [per_epoch - 1]
    diff = _max_diff(resumed["state"]["model"], finals[1])
    assert diff <= 1e-5, f"resumed 2 → 1 run ends {diff:.2e} away from the uninterrupted one"
