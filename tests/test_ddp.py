"""gpu_training.ddp: rank identity, sharding, reductions, unwrapping, and DDP parity.

Multi-rank tests run for real on gloo ranks on 127.0.0.1 through ``run_ranks``; the worker
functions live at module level so the rank processes can import them.
"""

from __future__ import annotations

import copy
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from dist_harness import find_free_port, run_python, run_ranks
from gpu_training.amp import MixedPrecisionTrainer
from gpu_training.ddp import (
    DistributedContext,
    cleanup_distributed,
    gradient_sync,
    init_distributed,
    make_distributed_sampler,
    reduce_scalar_dict,
    resolve_device,
    train_one_epoch,
    unwrap_model,
)

pytestmark = pytest.mark.timeout(180)


# --- single process ---------------------------------------------------------------------


def test_from_env_falls_back_to_single_process() -> None:
    ctx = DistributedContext.from_env({})
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (0, 0, 1, 1)
    assert ctx.is_main_process and not ctx.is_distributed
    ctx.barrier()  # no-op without a group


def test_from_env_reads_torchrun_variables() -> None:
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    ctx = DistributedContext.from_env(env)
    assert (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (5, 1, 8, 4)
    assert not ctx.is_main_process and not ctx.is_local_main_process and ctx.is_distributed


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK must be an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank must be in"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"},
            "local_rank",
        ),
    ],
)
def test_from_env_rejects_inconsistent_environment(env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DistributedContext.from_env(env)


def test_single_process_helpers_are_no_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    ctx = init_distributed()
    assert ctx.world_size == 1 and ctx.backend is None and not dist.is_initialized()
    assert resolve_device(ctx) == torch.device("cpu")
    assert make_distributed_sampler(list(range(10)), ctx) is None
    t = torch.tensor(2.5)
    assert reduce_scalar_dict({"b": 1, "a": t}, ctx) == {"a": 2.5, "b": 1.0}
    with pytest.raises(ValueError, match="scalar"):
        reduce_scalar_dict({"v": torch.ones(2)}, ctx)
    cleanup_distributed()
    cleanup_distributed()  # idempotent


def test_unwrap_model_strips_every_wrapper() -> None:
    port = find_free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        inner = nn.Linear(3, 2)
        ddp = DDP(inner)
        assert unwrap_model(ddp) is inner
        assert unwrap_model(torch.compile(ddp)) is inner
        assert unwrap_model(nn.DataParallel(nn.Sequential(inner))).__class__ is nn.Sequential
        assert unwrap_model(inner) is inner
        # The guide's point: the wrapper's keys carry `module.`; the unwrapped ones do not.
        assert all(k.startswith("module.") for k in ddp.state_dict())
        nn.Linear(3, 2).load_state_dict(unwrap_model(ddp).state_dict())
        del ddp
    finally:
        cleanup_distributed()


def test_gradient_sync_uses_fsdp2_setter_and_restores_it() -> None:
    calls: list[bool] = []

    class Sharded(nn.Linear):
        def set_requires_gradient_sync(self, flag: bool) -> None:
            calls.append(flag)

    with gradient_sync(Sharded(2, 2), enabled=False):
        assert calls == [False]
    assert calls == [False, True]
    with gradient_sync(nn.Linear(2, 2), enabled=False):
        pass  # plain module: nothing to switch off


# --- multi-rank workers -----------------------------------------------------------------


def _shard_worker(num_samples: int, epochs: int, drop_last: bool) -> dict[str, Any]:
    ctx = init_distributed()
    try:
        sampler = make_distributed_sampler(
            list(range(num_samples)), ctx, shuffle=True, seed=7, drop_last=drop_last
        )
        assert sampler is not None
        orders = []
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            orders.append(list(sampler))
        return {"rank": ctx.rank, "backend": ctx.backend, "orders": orders}
    finally:
        cleanup_distributed()


def _reduce_worker() -> dict[str, float]:
    ctx = init_distributed()
    try:
        local = {"loss": float(ctx.rank + 1), "acc": torch.tensor(10.0 * ctx.rank)}
        avg = reduce_scalar_dict(local, ctx, average=True)
        total = reduce_scalar_dict(local, ctx, average=False)
        return {"avg_loss": avg["loss"], "avg_acc": avg["acc"], "sum_loss": total["loss"]}
    finally:
        cleanup_distributed()


def _regression(num_samples: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, 6, generator=g)
    y = x @ torch.randn(6, 3, generator=g) + 0.1 * torch.randn(num_samples, 3, generator=g)
    return TensorDataset(x, y)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _ddp_parity_worker(steps: int, per_device: int, accum: int, epoch: int) -> dict[str, Any]:
    """Train with DDP + no_sync accumulation; replay the same global batches in one process."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    ctx = init_distributed()
    try:
        world = ctx.world_size
        dataset = _regression(steps * per_device * accum * world, seed=3)
        torch.manual_seed(0)
        model = _mlp()
        reference = copy.deepcopy(model)
        ddp = DDP(model)
        syncs = [0]

        # No annotations: DDP checks them at runtime and string annotations fail that check.
        def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
            syncs[0] += 1
            return allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, counting_hook)
        sampler = make_distributed_sampler(dataset, ctx, shuffle=True, seed=11, drop_last=True)
        loader = DataLoader(dataset, batch_size=per_device, sampler=sampler)
        trainer = MixedPrecisionTrainer(
            torch.optim.AdamW(ddp.parameters(), lr=1e-2),
            precision="fp32",
            grad_accum_steps=accum,
            max_grad_norm=1.0,
        )
        metrics = train_one_epoch(ddp, loader, trainer, nn.functional.mse_loss, ctx, epoch=epoch)

        # One process, one optimizer step per global batch (the union of every rank's
        # micro-batches of that step), mean loss over it, same clipping.
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        per_rank = []
        for r in range(world):
            s = DistributedSampler(dataset, world, r, shuffle=True, seed=11, drop_last=True)
            s.set_epoch(epoch)
            per_rank.append(list(s))
        span = per_device * accum
        ref_losses = []
        for step in range(steps):
            idx = [i for r in range(world) for i in per_rank[r][step * span : (step + 1) * span]]
            x, y = dataset[idx]
            loss = nn.functional.mse_loss(reference(x), y)
            ref_losses.append(loss.item())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
            ref_opt.step()
            ref_opt.zero_grad()
        diff = max(
            (a - b).abs().max().item()
            for a, b in zip(ddp.module.parameters(), reference.parameters(), strict=True)
        )
        params = [p.detach().clone() for p in ddp.module.parameters()]
        del ddp  # drop DDP's reducer before the group goes (docs/design.md, "Traps")
        return {
            "diff": diff,
            "syncs": syncs[0],
            "metrics": metrics,
            "params": params,
            "ref_mean_loss": sum(ref_losses) / len(ref_losses),
        }
    finally:
        cleanup_distributed()


# --- multi-rank tests -------------------------------------------------------------------


@pytest.mark.multirank
@pytest.mark.parametrize("nprocs", [2, 3])
def test_sampler_shards_are_disjoint_complete_and_reshuffle(nprocs: int) -> None:
    results = run_ranks(_shard_worker, nprocs, args=(12, 2, False), timeout=60)
    assert [r["rank"] for r in results] == list(range(nprocs))
    assert all(r["backend"] == "gloo" for r in results)
    for epoch in range(2):
        shards = [r["orders"][epoch] for r in results]
        flat = [i for shard in shards for i in shard]
        assert sorted(flat) == list(range(12)), "shards must cover the dataset exactly once"
    for r in results:
        assert r["orders"][0] != r["orders"][1], "set_epoch must change the order"
        assert sorted(r["orders"][0]) != sorted(r["orders"][1]) or nprocs == 1


@pytest.mark.multirank
def test_sampler_pads_or_drops_when_not_divisible() -> None:
    padded = run_ranks(_shard_worker, 2, args=(13, 1, False), timeout=60)
    sizes = {len(r["orders"][0]) for r in padded}
    assert sizes == {7}
    assert set(padded[0]["orders"][0]) | set(padded[1]["orders"][0]) == set(range(13))
    dropped = run_ranks(_shard_worker, 2, args=(13, 1, True), timeout=60)
    a, b = (set(r["orders"][0]) for r in dropped)
    assert len(a) == len(b) == 6 and not a & b


@pytest.mark.multirank
def test_reduce_scalar_dict_averages_across_ranks() -> None:
    results = run_ranks(_reduce_worker, 2, timeout=60)
    for r in results:
        assert r == {"avg_loss": 1.5, "avg_acc": 5.0, "sum_loss": 3.0}


@pytest.mark.multirank
def test_ddp_no_sync_accumulation_matches_single_process_big_batch() -> None:
    steps, per_device, accum = 4, 4, 2
    results = run_ranks(_ddp_parity_worker, 2, args=(steps, per_device, accum, 1), timeout=120)
    for r in results:
        assert r["diff"] <= 1e-6, f"DDP weights differ from one process by {r['diff']:.2e}"
        # no_sync off the boundary: one all-reduce per optimizer step, not per micro-batch.
        assert r["syncs"] == steps, f"{r['syncs']} gradient syncs for {steps} steps"
        assert r["metrics"]["steps"] == steps
        assert r["metrics"]["samples"] == steps * per_device * accum
        assert r["metrics"]["loss"] == pytest.approx(r["ref_mean_loss"], rel=1e-5)
    for a, b in zip(results[0]["params"], results[1]["params"], strict=True):
        assert torch.equal(a, b), "ranks diverged"


# --- teardown: the success path barriers, the failure path never waits ------------------------


@pytest.fixture
def one_rank_group(free_port: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A real 1-rank gloo group in this process; the barrier calls cleanup makes, recorded."""
    calls: list[str] = []
    real_barrier = dist.barrier

    def barrier(*args: Any, **kwargs: Any) -> Any:
        calls.append("barrier")
        return real_barrier(*args, **kwargs)

    monkeypatch.setattr(dist, "barrier", barrier)
    store = dist.TCPStore("127.0.0.1", free_port, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    return calls


def test_cleanup_barriers_on_success(one_rank_group: list[str]) -> None:
    cleanup_distributed()
    assert one_rank_group == ["barrier"] and not dist.is_initialized()


def test_cleanup_in_finally_of_a_failure_skips_the_barrier(one_rank_group: list[str]) -> None:
    with pytest.raises(RuntimeError, match="a rank failed"):
        try:
            raise RuntimeError("a rank failed")
        finally:
            cleanup_distributed()  # GT015's pattern: the peers would wait in another collective
    assert one_rank_group == [] and not dist.is_initialized()


def test_context_barrier_does_not_wait_for_peers_during_a_failure(
    one_rank_group: list[str],
) -> None:
    ctx = DistributedContext(rank=0, local_rank=0, world_size=2, local_world_size=2)
    with pytest.raises(KeyError):
        try:
            raise KeyError("a rank failed")
        finally:
            ctx.barrier()  # a user's `finally:`: the peers are in another collective
    assert one_rank_group == []
    ctx.barrier()
    assert one_rank_group == ["barrier"]
    cleanup_distributed()


_BLOCKED_TEARDOWN = """
import time
import torch
import torch.distributed as dist
from gpu_training.ddp import cleanup_distributed, init_distributed

ctx = init_distributed()
try:
    if ctx.rank == 0:
        work = dist.all_reduce(torch.ones(1 << 16), async_op=True)  # rank 1 never joins
        time.sleep(0.5)
        print(f"FAULT_AT {time.time():.3f}", flush=True)
        raise RuntimeError("rank 0 fails with a collective in flight")
    time.sleep(60)  # blocked elsewhere: it will not complete rank 0's all_reduce
finally:
    cleanup_distributed()
"""


@pytest.mark.multirank
@pytest.mark.serial
def test_failed_rank_whose_group_cannot_be_destroyed_exits_anyway(tmp_path: Path) -> None:
    """gloo's destroy waits for this rank's unfinished all_reduce: the deadline ends it."""
    script = tmp_path / "blocked.py"
    script.write_text(_BLOCKED_TEARDOWN)
    args = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = run_python([*args, f"--log-dir={tmp_path / 'logs'}", str(script)], timeout=60)
    ended = time.time()
    text = proc.stdout + proc.stderr
    fault = float(re.search(r"FAULT_AT (\d+\.\d+)", text)[1])  # type: ignore[index]
    assert proc.returncode != 0
    assert ended - fault < 10, f"ended {ended - fault:.1f}s after the fault"
    assert "tearing down its process group took more than 3s" in text, text[-3000:]
    root = text.rsplit("Root Cause (first observed failure)", 1)[1]
    assert "rank 0 fails with a collective in flight" in root and "rank      : 0" in root


def _detail_ddp_worker() -> str:
    ctx = init_distributed()  # TORCH_DISTRIBUTED_DEBUG=DETAIL: a ProcessGroupWrapper on gloo
    model = DDP(nn.Linear(4, 2))
    model(torch.randn(3, 4)).sum().backward()
    kind = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
    del model
    cleanup_distributed()
    return f"{ctx.rank} {kind}"


@pytest.mark.multirank
def test_ddp_builds_and_trains_under_detail_debug_on_gloo() -> None:
    """torch 2.13 segfaults in DDP's constructor under DETAIL on gloo; init_distributed fixes it."""
    results = run_ranks(
        _detail_ddp_worker, 2, timeout=90, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    )
    assert results == ["0 _ProcessGroupWrapper", "1 _ProcessGroupWrapper"]
