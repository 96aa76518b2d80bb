"""Tests for the batch-size finder (gpu_training.profiling).

The search is exact for a monotone ``fits``: the tests compare it with brute force, check the
probe bound 2·⌈log₂ b*⌉ + 2, treat OOM errors as "does not fit", and run it on two gloo ranks
with different memory limits. On the CPU nothing runs out of memory by itself, so ``make_fits``
is tested on a model that raises the allocator's error above a byte budget.
"""

from __future__ import annotations

import gc
import math
from fractions import Fraction
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from dist_harness import run_ranks
from gpu_training.ddp import DistributedContext
from gpu_training.profiling import (
    BatchSearchResult,
    BatchSizeError,
    find_max_batch_size,
    is_out_of_memory,
    make_fits,
    search_max_batch_size,
)


def _limit(limit: int) -> Any:
    """A synthetic ``fits``: batches up to ``limit`` fit."""
    return lambda batch: batch <= limit


def _expected(best: int, margin: float, min_batch: int = 1) -> int:
    return max(min_batch, math.floor(Fraction(str(margin)) * best))


def _probe_bound(best: int) -> int:
    return 2 * math.ceil(math.log2(best)) + 2


# --- the search --------------------------------------------------------------------------


def test_exact_and_within_probe_bound_for_every_limit_up_to_5000() -> None:
    worst = 0
    for limit in range(1, 5001):
        calls: list[int] = []

        def fits(batch: int, limit: int = limit, calls: list[int] = calls) -> bool:
            calls.append(batch)
            return batch <= limit

        result = search_max_batch_size(fits, min_batch=1, max_batch=8192, safety_margin=0.85)
        assert result.best_fitting == limit
        assert result.recommended == _expected(limit, 0.85)
        assert [b for b, _ in result.probes] == calls  # the report records every call
        assert len(set(calls)) == len(calls), f"limit {limit}: a batch was probed twice"
        assert result.num_probes <= _probe_bound(limit), (limit, result.probes)
        assert all(ok == (b <= limit) for b, ok in result.probes)
        worst = max(worst, result.num_probes - _probe_bound(limit))
    assert worst == 0  # the bound is tight (powers of two reach it exactly)


@pytest.mark.parametrize("k", range(13))
def test_powers_of_two_take_exactly_the_bound(k: int) -> None:
    result = search_max_batch_size(_limit(2**k), max_batch=8192)
    assert result.best_fitting == 2**k
    assert result.num_probes == 2 * k + 2


def test_matches_brute_force_on_small_ranges() -> None:
    for min_batch in range(1, 13):
        for max_batch in range(min_batch, 40):
            for limit in range(min_batch, 45):
                result = search_max_batch_size(_limit(limit), min_batch, max_batch, 0.9)
                truth = max(b for b in range(min_batch, max_batch + 1) if b <= limit)
                assert result.best_fitting == truth, (min_batch, max_batch, limit)
                assert result.recommended == _expected(truth, 0.9, min_batch)
                assert all(min_batch <= b <= max_batch for b, _ in result.probes)


@pytest.mark.parametrize(
    ("min_batch", "max_batch", "limit", "best"),
    [
        (1, 1024, 10**6, 1024),  # everything fits: stop at the ceiling
        (1, 1000, 999, 999),  # non-power-of-two ceiling
        (1, 1000, 1000, 1000),
        (1, 1000, 5000, 1000),
        (7, 7, 7, 7),  # a one-point range
        (8, 4096, 8, 8),  # only min_batch fits
        (3, 5000, 4999, 4999),
        (32, 512, 100, 100),
    ],
)
def test_edges(min_batch: int, max_batch: int, limit: int, best: int) -> None:
    result = search_max_batch_size(_limit(limit), min_batch, max_batch, 0.85)
    assert result.best_fitting == best
    assert result.recommended == _expected(best, 0.85, min_batch)
    assert result.hit_max_batch == (best == max_batch)
    assert find_max_batch_size(_limit(limit), min_batch, max_batch, 0.85) == result.recommended


def test_guide_call_returns_int_with_default_margin() -> None:
    best = find_max_batch_size(_limit(200), min_batch=1, max_batch=1024, safety_margin=0.85)
    assert best == 170 and type(best) is int


@pytest.mark.parametrize(
    ("margin", "best", "expected"),
    [(1.0, 37, 37), (0.29, 100, 29), (0.85, 20, 17), (0.9, 10, 9), (0.01, 50, 4)],
)
def test_margin_is_exact_decimal_and_floored_at_min_batch(
    margin: float, best: int, expected: int
) -> None:
    # 0.29 * 100 == 28.999999999999996 in binary floating point; the finder says 29.
    assert find_max_batch_size(_limit(best), 4, 4096, margin) == expected


# --- out of memory and other errors ------------------------------------------------------


@pytest.mark.parametrize(
    "oom",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"),
    ],
)
def test_oom_counts_as_no_fit(oom: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    collected: list[int] = []
    emptied: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))

    def fits(batch: int) -> bool:
        if batch > 300:
            raise oom
        return True

    result = search_max_batch_size(fits, max_batch=4096, safety_margin=0.85)
    assert result.best_fitting == 300 and result.recommended == 255
    failures = sum(not ok for _, ok in result.probes)
    assert failures > 0
    assert len(collected) == len(emptied) == failures  # the cache is cleared after each OOM


def test_real_cpu_allocator_error_is_recognised() -> None:
    with pytest.raises(RuntimeError) as info:
        torch.empty(10**16, dtype=torch.uint8)  # 10 PB: no machine has it
    assert is_out_of_memory(info.value)
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))  # only allocator error types


@pytest.mark.parametrize("error", [ValueError("bad batch"), RuntimeError("size mismatch")])
def test_other_exceptions_propagate(error: Exception) -> None:
    seen: list[int] = []

    def fits(batch: int) -> bool:
        seen.append(batch)
        if batch == 16:
            raise error
        return True

    with pytest.raises(type(error), match=str(error)):
        find_max_batch_size(fits, max_batch=1024)
    assert seen == [1, 2, 4, 8, 16]  # stopped at the error, no retry


def test_fits_returning_none_is_an_error() -> None:
    with pytest.raises(TypeError, match="returned None"):
        find_max_batch_size(lambda batch: None, max_batch=8)  # type: ignore[arg-type, return-value]


@pytest.mark.parametrize("how", ["false", "oom"])
def test_min_batch_that_does_not_fit_raises_actionable_error(how: str) -> None:
    calls: list[int] = []

    def fits(batch: int) -> bool:
        calls.append(batch)
        if how == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory")
        return False

    with pytest.raises(BatchSizeError) as info:
        find_max_batch_size(fits, min_batch=4, max_batch=1024)
    assert calls == [4]  # immediately, without probing further
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert "min_batch=4" in message
    for advice in ("activation checkpointing", "gradient accumulation", "smaller model"):
        assert advice in message
    assert "shorter sequence" in message


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_batch": 0}, "min_batch must be a positive integer"),
        ({"min_batch": -3}, "min_batch must be a positive integer"),
        ({"max_batch": 0}, "max_batch must be a positive integer"),
        ({"max_batch": 2.0}, "max_batch must be a positive integer"),
        ({"min_batch": True}, "min_batch must be a positive integer"),
        ({"min_batch": 64, "max_batch": 32}, r"min_batch \(64\) must be <= max_batch \(32\)"),
        ({"safety_margin": 0.0}, r"safety_margin must be a number in \(0, 1\]"),
        ({"safety_margin": 1.5}, r"safety_margin must be a number in \(0, 1\]"),
        ({"safety_margin": -0.1}, r"safety_margin must be a number in \(0, 1\]"),
        ({"safety_margin": float("nan")}, r"safety_margin must be a number in \(0, 1\]"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    calls: list[int] = []
    with pytest.raises(ValueError, match=match):
        find_max_batch_size(lambda b: calls.append(b) is None, **kwargs)
    assert calls == []  # validated before any probe


def test_fits_must_be_callable() -> None:
    with pytest.raises(TypeError, match="fits must be callable"):
        find_max_batch_size(64)  # type: ignore[arg-type]


def test_distributed_ctx_without_process_group_is_refused() -> None:
    ctx = DistributedContext(rank=0, world_size=2, local_world_size=2)
    with pytest.raises(RuntimeError, match="init_distributed"):
        find_max_batch_size(_limit(10), ctx=ctx)
    assert find_max_batch_size(_limit(10), ctx=DistributedContext()) == 8  # one process


# --- two ranks agree ---------------------------------------------------------------------


def _rank_searches(limits: tuple[int, int]) -> dict[str, Any]:
    """Runs on each rank: the searches below, each ending the same way on every rank."""
    from gpu_training.ddp import cleanup_distributed, init_distributed

    ctx = init_distributed()
    out: dict[str, Any] = {}
    try:
        limit = limits[ctx.rank]
        calls: list[int] = []

        def fits(batch: int) -> bool:
            calls.append(batch)
            if ctx.rank == 1 and batch > limit:
                raise torch.OutOfMemoryError("CUDA out of memory")  # rank 1 OOMs, rank 0 says no
            return batch <= limit

        result = search_max_batch_size(fits, 1, 4096, 0.85, ctx=ctx)
        out["result"] = (result.best_fitting, result.recommended, result.probes)
        out["calls"] = calls
        out["find"] = find_max_batch_size(_limit(limit), 2, 1000, 0.9, ctx=ctx)

        try:  # min_batch fits on rank 0 only: every rank must raise, none may hang
            find_max_batch_size(_limit(16 if ctx.rank == 0 else 4), min_batch=8, ctx=ctx)
        except BatchSizeError as err:
            out["min_batch"] = type(err).__name__

        def fails_on_rank_1(batch: int) -> bool:
            if ctx.rank == 1 and batch == 8:
                raise ValueError("broken probe on rank 1")
            return True

        try:
            find_max_batch_size(fails_on_rank_1, max_batch=64, ctx=ctx)
        except (ValueError, RuntimeError) as err:
            out["error"] = (type(err).__name__, str(err))
        # Still in step: a collective after the failure completes on both ranks.
        out["after"] = find_max_batch_size(_limit(50), max_batch=64, ctx=ctx)
    finally:
        cleanup_distributed()
    return out


@pytest.mark.multirank
def test_two_ranks_agree_on_the_smaller_limit() -> None:
    rank0, rank1 = run_ranks(_rank_searches, 2, args=((700, 300),), timeout=90)
    assert rank0["result"] == rank1["result"]
    best, recommended, probes = rank0["result"]
    assert (best, recommended) == (300, 255)  # the smaller limit wins, on both ranks
    assert rank0["calls"] == rank1["calls"] == [b for b, _ in probes]  # same probes everywhere
    assert rank0["find"] == rank1["find"] == math.floor(0.9 * 300)
    assert rank0["min_batch"] == rank1["min_batch"] == "BatchSizeError"
    assert rank1["error"] == ("ValueError", "broken probe on rank 1")
    assert rank0["error"][0] == "RuntimeError" and "rank 1" in rank0["error"][1]
    assert rank0["after"] == rank1["after"] == _expected(50, 0.85)


# --- make_fits ---------------------------------------------------------------------------


class _BudgetedMLP(nn.Module):
    """An MLP whose 'allocator' fails once a batch's activations exceed a byte budget."""

    def __init__(self, budget_bytes: int, fail_in_backward: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 3))
        self.budget_bytes = budget_bytes
        self.fail_in_backward = fail_in_backward
        self.batches_seen: list[int] = []

    def bytes_for(self, batch: int) -> int:
        return batch * 64 * 4 * 3  # three fp32 activations of width 64 per sample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches_seen.append(x.shape[0])
        over = self.bytes_for(x.shape[0]) > self.budget_bytes
        if over and not self.fail_in_backward:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.shape[0]}")
        hidden = self.net[1](self.net[0](x))
        if over:  # fail halfway through backward, once the last layer's gradients exist

            def _oom(grad: torch.Tensor) -> torch.Tensor:
                raise RuntimeError("CUDA out of memory. Tried to allocate 64.00 MiB")

            hidden.register_hook(_oom)
        out = self.net[3](self.net[2](hidden))
        return out


def _batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, 16), torch.randint(3, (size,))


class _CountingSGD(torch.optim.SGD):
    instances: ClassVar[list[_CountingSGD]] = []

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.5, momentum=0.9)
        self.steps = 0
        _CountingSGD.instances.append(self)

    def step(self, closure: Any = None) -> Any:
        self.steps += 1
        return super().step(closure)


@pytest.mark.parametrize("fail_in_backward", [False, True])
def test_make_fits_finds_a_batch_under_the_budget(fail_in_backward: bool) -> None:
    torch.manual_seed(0)
    model = _BudgetedMLP(budget_bytes=1_000_000, fail_in_backward=fail_in_backward)
    model.eval()
    limit = 1_000_000 // model.bytes_for(1)  # 1302 samples
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _CountingSGD.instances.clear()

    fits = make_fits(model, _batch, nn.functional.cross_entropy, _CountingSGD, precision="fp32")
    # BatchNorm cannot train on one sample, so the search starts at 2.
    result = search_max_batch_size(fits, min_batch=2, max_batch=4096, safety_margin=0.85)

    assert result.best_fitting == limit
    assert result.recommended == math.floor(0.85 * limit)
    assert model.bytes_for(result.recommended) <= model.budget_bytes
    assert model.batches_seen == [b for b, _ in result.probes]
    # Every passing probe ran a full step with a fresh optimizer; failing ones stepped nothing.
    assert len(_CountingSGD.instances) == result.num_probes
    assert [o.steps for o in _CountingSGD.instances] == [int(ok) for _, ok in result.probes]
    assert all(not o.state for o in _CountingSGD.instances)  # optimizer state dropped
    # Probing left the model as it was: weights, BatchNorm statistics, mode, no gradients.
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not model.training
    assert all(p.grad is None for p in model.parameters())


def test_make_fits_default_optimizer_and_fp16_on_cpu() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
    fits = make_fits(model, _batch, nn.functional.cross_entropy, precision="fp16")
    assert fits(8) is True
    assert all(p.grad is None for p in model.parameters())


def test_make_fits_propagates_other_errors_and_restores_the_model() -> None:
    model = nn.Sequential(nn.Linear(16, 3))
    before = [p.clone() for p in model.parameters()]

    def bad_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(size, 15), torch.randint(3, (size,))  # wrong width

    fits = make_fits(model, bad_batch, nn.functional.cross_entropy, precision="fp32")
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        fits(4)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_search_result_is_a_dataclass_report() -> None:
    result = search_max_batch_size(_limit(48), max_batch=256, safety_margin=0.9)
    assert isinstance(result, BatchSearchResult)
    assert (result.best_fitting, result.recommended) == (48, 43)
    assert list(result.probes[:7]) == [*((2**i, True) for i in range(6)), (64, False)]
    assert not result.hit_max_batch


@pytest.mark.requires_cuda
def test_make_fits_stops_at_a_real_cuda_oom_without_leaking() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.empty_cache()
    # Pretend the GPU has 2 GiB, so the doubling hits a genuine allocator OOM quickly.
    torch.cuda.set_per_process_memory_fraction(2 * 2**30 / total, device)
    try:
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10)).to(device)
        # Garbage of earlier tests (a failed test's frames) would be freed by the probes'
        # own collection and read as "less than before": collect it first.
        gc.collect()
        baseline = torch.cuda.memory_allocated(device)

        def make_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(size, 1024), torch.randint(10, (size,))

        fits = make_fits(model, make_batch, nn.functional.cross_entropy, precision="fp32")
        result = search_max_batch_size(fits, min_batch=1, max_batch=2**20)
        assert 1 < result.best_fitting < 2**20  # an OOM, not the ceiling, ended the search
        assert any(not ok for _, ok in result.probes)
        gc.collect()
        assert torch.cuda.memory_allocated(device) == baseline  # probes left nothing behind
        assert fits(result.recommended)  # the recommendation trains after the OOMs
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()


# --- profiler traces ---------------------------------------------------------------------


def test_profile_steps_writes_a_trace_of_the_active_steps(tmp_path: Any) -> None:
    from gpu_training.profiling import profile_steps

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    calls: list[int] = []

    def step(i: int) -> None:
        calls.append(i)
        model(torch.randn(16, 32)).sum().backward()

    result = profile_steps(step, tmp_path / "prof", steps=3, warmup=1)
    assert calls == [0, 1, 2, 3]
    assert result.trace_path == tmp_path / "prof" / "trace_rank0.json"
    import json

    events = json.loads(result.trace_path.read_text())["traceEvents"]
    steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"}  # warm-up dropped
    assert "aten::addmm" in result.table
    # Other ranks run the same steps (same collectives) but neither profile nor write.
    calls.clear()
    other = profile_steps(
        step,
        tmp_path / "other",
        steps=2,
        warmup=0,
        ctx=DistributedContext(rank=1, world_size=2, local_world_size=2),
    )
    assert other.trace_path is None and calls == [0, 1]
    assert not (tmp_path / "other").exists()
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        profile_steps(step, tmp_path, steps=0)
