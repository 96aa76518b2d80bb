"""Tests for sharded (FSDP2 / DCP) checkpoints and consolidation.

Multi-rank tests run FSDP2 for real on CPU with gloo (``fully_shard`` per block on a 1-D
``init_device_mesh("cpu", (W,))``). Round trips compare the *full* model and optimizer state
with ``torch.equal``; failures are injected into the real write path on one rank; hostile
files really carry a payload that creates a file when unpickled naively.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import pickle
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from dist_harness import run_ranks
from gpu_training.checkpoint import (
    EXTRA_NAME,
    MANIFEST_NAME,
    CheckpointError,
    CheckpointManager,
    consolidate,
    find_checkpoint,
    read_manifest,
    verify_checkpoints,
)
from gpu_training.ddp import DistributedContext

SINGLE = DistributedContext()
_FULL = StateDictOptions(full_state_dict=True)
_X = torch.linspace(-1.0, 1.0, 5 * 8).reshape(5, 8)  # the fixed input for output checks


# ----------------------------------------------------------------------------------------------
# helpers (module level: the rank workers import them)


def _build(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    blocks = [nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3)]
    return nn.Sequential(*blocks, nn.Linear(8, 3))


def _shard(model: nn.Sequential, world_size: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    for block in list(model)[:3]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _train(model: nn.Module, opt: torch.optim.Optimizer, rank: int, steps: int = 2) -> None:
    for i in range(steps):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 + 10 * i + rank))
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def _full_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state as full tensors (gathered from the shards under FSDP2)."""
    model_state, optim_state = get_state_dict(model, opt, options=_FULL)
    return {"model": model_state, "optim": optim_state}


def _assert_same(a: Any, b: Any, where: str = "state") -> None:
    """Recursive equality; tensors must match in dtype, shape and every bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where}: tensors differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {set(a) ^ set(b)}"
        for key in a:
            _assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _fresh(seed: int = 7, world_size: int = 0) -> tuple[nn.Sequential, torch.optim.AdamW]:
    """A differently initialised model (FSDP2-sharded when ``world_size``) and an optimizer
    with another lr and no state."""
    model = _build(seed)
    if world_size:
        _shard(model, world_size)  # before the optimizer: fully_shard swaps the parameters
    return model, torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.3)


def _trained_plain(seed: int = 3) -> tuple[nn.Sequential, torch.optim.AdamW]:
    model = _build(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    _train(model, opt, rank=0)
    return model, opt


def _rewrite_manifest_entry(step_dir: Path, name: str) -> None:
    """Makes the manifest agree with ``name``'s current bytes (checksums are no defence)."""
    manifest = json.loads((step_dir / MANIFEST_NAME).read_text())
    data = (step_dir / name).read_bytes()
    for entry in manifest["files"]:
        if entry["name"] == name:
            entry["size"] = len(data)
            entry["checksum"] = f"crc32:{zlib.crc32(data):08x}"
    (step_dir / MANIFEST_NAME).write_text(json.dumps(manifest))


def _flip_byte(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0xFF
    file.write_bytes(bytes(data))


def _tmp_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".tmp-"))


class _Touch:
    """Unpickling this creates ``path``: stands for any code an attacker would run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.touch, (self.path,))


# ----------------------------------------------------------------------------------------------
# rank workers


def _fsdp_worker(root: str, one_process_root: str) -> dict[str, Any]:
    """2 ranks: load a 1-process checkpoint into FSDP2; train FSDP2, save, reload at 2 ranks.

    One launch for both directions: on 2 cores most of a launch is importing torch.
    """
    from gpu_training.ddp import cleanup_distributed, init_distributed

    ctx = init_distributed()
    try:
        from_one, from_one_opt = _fresh(world_size=ctx.world_size)
        from_one_extra = CheckpointManager(one_process_root, ctx=ctx).load_sharded(
            from_one, from_one_opt, 4
        )
        from_one_state = _full_state(from_one, from_one_opt)
        del from_one, from_one_opt

        model = _build(0)
        _shard(model, ctx.world_size)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        _train(model, opt, ctx.rank)
        ckpt = CheckpointManager(root, ctx=ctx, keep_last_n=2)
        extra = {"step": 10, "note": "fsdp", "rank": ctx.rank, "t": torch.arange(3)}
        path = ckpt.save_sharded(model, opt, 10, extra=extra)
        saved = _full_state(model, opt)
        with torch.no_grad():
            output = model(_X)

        model2, opt2 = _fresh(world_size=ctx.world_size)
        loaded_extra = ckpt.load_sharded(model2, opt2)
        reloaded = _full_state(model2, opt2)
        with torch.no_grad():
            output2 = model2(_X)
        return {
            "path": path,
            "saved": saved,
            "output": output,
            "reloaded": reloaded,
            "output2": output2,
            "extra": loaded_extra,
            "from_one": from_one_state,
            "from_one_extra": from_one_extra,
        }
    finally:
        cleanup_distributed()


def _expect_error(fn: Any, *args: Any, **kwargs: Any) -> str:
    try:
        fn(*args, **kwargs)
    except CheckpointError as exc:
        return str(exc)
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise CheckpointError")


def _failure_worker(root: str) -> dict[str, Any]:
    """2 ranks: failures on one rank, at each phase, must surface on both, cleanly."""
    import torch.distributed.checkpoint as dcp

    import gpu_training.checkpoint.collective as collective
    import gpu_training.checkpoint.sharded as sharded
    from gpu_training.ddp import cleanup_distributed, init_distributed

    ctx = init_distributed()
    out: dict[str, Any] = {}
    try:
        model = _build(0)
        _shard(model, ctx.world_size)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        _train(model, opt, ctx.rank)
        ckpt = CheckpointManager(root, ctx=ctx, keep_last_n=1)
        ckpt.save_sharded(model, opt, 1, extra={"step": 1})
        before = copy.deepcopy(_full_state(model, opt))  # "step" tensors are live references
        _train(model, opt, ctx.rank, steps=1)  # the failed saves hold different values

        # 1) rank 1's shard write fails inside dcp.save
        real_write = dcp.FileSystemWriter.write_data

        def broken_write(self: Any, plan: Any, planner: Any) -> Any:
            raise OSError(28, "No space left on device (injected on rank 1)")

        if ctx.rank == 1:
            dcp.FileSystemWriter.write_data = broken_write  # type: ignore[method-assign]
        out["write"] = _expect_error(ckpt.save_sharded, model, opt, 2, extra={"step": 2})
        dcp.FileSystemWriter.write_data = real_write  # type: ignore[method-assign]
        ctx.barrier()
        out["after_write"] = (_tmp_dirs(Path(root)), [p.name for p in ckpt.list_checkpoints()])
        ctx.barrier()  # every rank has looked before rank 0 starts the next save

        # 2) rank 1 fails before any shard is written (its state cannot be gathered)
        real_get = sharded.get_state_dict

        def broken_get(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("injected get_state_dict failure on rank 1")

        if ctx.rank == 1:
            sharded.get_state_dict = broken_get  # type: ignore[assignment]
        out["prepare"] = _expect_error(ckpt.save_sharded, model, opt, 3)
        sharded.get_state_dict = real_get  # type: ignore[assignment]

        # 3) rank 0's extra state is not loadable with weights_only=True
        extra: dict[str, Any] = {"step": 4}
        if ctx.rank == 0:
            extra["sampler"] = _Touch(Path(root) / "never")
        out["extra"] = _expect_error(ckpt.save_sharded, model, opt, 4, extra=extra)
        ctx.barrier()
        out["after_all"] = (_tmp_dirs(Path(root)), [p.name for p in ckpt.list_checkpoints()])
        ctx.barrier()

        # the surviving checkpoint is intact and still loads, bit for bit
        out["verify"] = ckpt.verify(1)
        model2, opt2 = _fresh(world_size=ctx.world_size)
        ckpt.load_sharded(model2, opt2)
        out["reloaded_equal_step1"] = True
        _assert_same(before, _full_state(model2, opt2))

        # 4) a load that fails on rank 1 only (set_state_dict) fails on both ranks
        real_set = sharded.set_state_dict

        def broken_set(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("injected set_state_dict failure on rank 1")

        if ctx.rank == 1:
            sharded.set_state_dict = broken_set
        out["load"] = _expect_error(ckpt.load_sharded, model2, opt2)
        sharded.set_state_dict = real_set

        # 5) the ranks do not see the same files (a directory that is not shared)
        real_own = collective._own_files

        def unshared(tmp: Path, ctx_: Any) -> list[dict[str, Any]]:
            fake = {"name": "__1_9.distcp", "size": 1, "checksum": "crc32:00000000"}
            return [*real_own(tmp, ctx_), fake]  # a file only rank 1 would see

        if ctx.rank == 1:
            collective._own_files = unshared
        out["unshared"] = _expect_error(ckpt.save_sharded, model, opt, 6)
        collective._own_files = real_own

        # and the manager still works afterwards: a new save commits and prunes step 1
        ckpt.save_sharded(model, opt, 5)
        ctx.barrier()
        out["final"] = (_tmp_dirs(Path(root)), [p.name for p in ckpt.list_checkpoints()])

        # 6) a corrupted shard: the rank that checksums it tells every rank
        ctx.barrier()  # rewriting the file truncates it first: no rank may be reading it
        if ctx.rank == 0:
            _flip_byte(Path(root) / "step-00000005" / "__1_0.distcp", 100)
        ctx.barrier()
        out["corrupt"] = _expect_error(ckpt.load_sharded, model2, opt2, 5)
        return out
    finally:
        cleanup_distributed()


# ----------------------------------------------------------------------------------------------
# FSDP2 at 2 ranks -> 2 ranks, 1 process, consolidated files


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One 2-rank FSDP2 session; its results are checked by the tests below."""
    base = tmp_path_factory.mktemp("fsdp")
    model, opt = _trained_plain()
    CheckpointManager(base / "one", ctx=SINGLE).save_sharded(model, opt, 4, extra={"step": 4})
    assert read_manifest(base / "one")[1]["world_size"] == 1
    root = base / "ckpt"
    results = run_ranks(_fsdp_worker, 2, args=(str(root), str(base / "one")), timeout=150)
    assert results[1]["path"] is None  # only rank 0 reports the directory
    for res in results:  # 1 process -> 2 ranks: both ranks hold the same full state
        _assert_same(_full_state(model, opt), res["from_one"])
        assert res["from_one_extra"] == {"step": 4}
    return root, results[0]


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_fsdp_two_ranks_save_and_reload_at_two(fsdp_run: tuple[Path, dict[str, Any]]) -> None:
    root, res = fsdp_run
    assert res["path"] == root / "step-00000010"
    _assert_same(res["saved"], res["reloaded"])  # model AND AdamW state, every bit
    assert res["saved"]["optim"]["state"]  # the optimizer really had state to restore
    assert res["reloaded"]["optim"]["param_groups"][0]["lr"] == 0.01  # not the fresh 0.5
    assert torch.equal(res["output"], res["output2"])
    assert res["extra"]["step"] == 10 and res["extra"]["rank"] == 0  # rank 0's copy
    assert torch.equal(res["extra"]["t"], torch.arange(3))


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_fsdp_layout_and_manifest(fsdp_run: tuple[Path, dict[str, Any]]) -> None:
    root, _ = fsdp_run
    step_dir = root / "step-00000010"
    manifest = json.loads((step_dir / MANIFEST_NAME).read_text())
    assert manifest["state_format"] == "dcp"
    assert manifest["world_size"] == 2 and manifest["step"] == 10
    names = [f["name"] for f in manifest["files"]]
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", EXTRA_NAME]
    assert sorted(p.name for p in step_dir.iterdir()) == sorted([*names, MANIFEST_NAME])
    for entry in manifest["files"]:
        data = (step_dir / entry["name"]).read_bytes()
        assert entry["size"] == len(data)
        assert entry["checksum"] == f"xxh3:{xxhash.xxh3_64_intdigest(data):016x}"
    ckpt = CheckpointManager(root, ctx=SINGLE)
    assert ckpt.list_checkpoints() == [step_dir]
    assert ckpt.latest(verify_checksums=True) == step_dir
    assert verify_checkpoints(root) == {step_dir: []}
    assert _tmp_dirs(root) == []


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_fsdp_two_ranks_to_one_process_plain_model(fsdp_run: tuple[Path, dict[str, Any]]) -> None:
    root, res = fsdp_run
    import torch.distributed as dist

    assert not dist.is_initialized()  # the single-process path: no process group at all
    model, opt = _fresh()
    extra = CheckpointManager(root, ctx=SINGLE).load_sharded(model, opt)
    _assert_same(res["saved"], _full_state(model, opt))
    assert extra["step"] == 10 and extra["note"] == "fsdp"
    with torch.no_grad():
        assert torch.equal(model(_X), res["output"])
    # the model alone, without an optimizer
    weights_only_model = _build(11)
    CheckpointManager(root, ctx=SINGLE).load_sharded(weights_only_model, None, 10)
    _assert_same(res["saved"]["model"], weights_only_model.state_dict())


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_consolidate_fsdp_checkpoint(fsdp_run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    root, res = fsdp_run
    st = consolidate(root, tmp_path / "model.safetensors")
    pt = consolidate(root / "step-00000010", tmp_path / "model.pt")
    full = consolidate(root, tmp_path / "full.pt", include_optimizer=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "full.pt",
        "model.pt",
        "model.safetensors",
    ]

    for weights in (load_file(st), torch.load(pt, weights_only=True)):
        model = _build(21)
        model.load_state_dict(weights)  # strict: no wrapper prefixes, nothing missing
        _assert_same(res["saved"]["model"], model.state_dict())
        with torch.no_grad():
            assert torch.equal(model(_X), res["output"])  # same outputs as the FSDP model
    with safe_open(st, framework="pt") as f:
        assert f.metadata() == {"format": "pt", "step": "10"}

    bundle = torch.load(full, weights_only=True)
    assert sorted(bundle) == ["extra", "model_state", "optimizer_state"]
    model, opt = _fresh()
    set_state_dict(
        model,
        opt,
        model_state_dict=bundle["model_state"],
        optim_state_dict=bundle["optimizer_state"],
        options=_FULL,
    )
    _assert_same(res["saved"], _full_state(model, opt))
    assert bundle["extra"]["step"] == 10


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_one_process_save_loads_into_fsdp_at_two_ranks(
    fsdp_run: tuple[Path, dict[str, Any]],
) -> None:
    _, res = fsdp_run  # the fixture compared both ranks' state with the saved model's
    assert res["from_one"]["optim"]["state"]
    assert res["from_one"]["optim"]["param_groups"][0]["lr"] == 0.01


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_failure_on_one_rank_reaches_every_rank(tmp_path: Path) -> None:
    results = run_ranks(_failure_worker, 2, args=(str(tmp_path),), timeout=150)
    for rank, out in enumerate(results):
        assert "injected on rank 1" in out["write"] and "rank 1" in out["write"], out["write"]
        assert "injected get_state_dict failure on rank 1" in out["prepare"], out["prepare"]
        assert "rank 0" in out["extra"] and "weights_only" in out["extra"], out["extra"]
        assert "injected set_state_dict failure on rank 1" in out["load"], out["load"]
        # no temporary directory left, the previous checkpoint kept (nothing pruned)
        assert out["after_write"] == ([], ["step-00000001"]), rank
        assert out["after_all"] == ([], ["step-00000001"]), rank
        assert out["verify"] == []
        assert out["reloaded_equal_step1"]
        assert "__1_9.distcp" in out["unshared"] and "shares" in out["unshared"], out["unshared"]
        assert out["final"] == ([], ["step-00000005"])
        assert "__1_0.distcp: checksum mismatch" in out["corrupt"], out["corrupt"]
    assert not (tmp_path / "never").exists()


# ----------------------------------------------------------------------------------------------
# one process


def test_single_process_round_trip_and_pruning_across_formats(tmp_path: Path) -> None:
    model, opt = _trained_plain()
    ckpt = CheckpointManager(tmp_path, ctx=SINGLE, keep_last_n=2)
    ckpt.save({"model_state": model.state_dict()}, step=1)
    assert ckpt.save_sharded(model, opt, 2, extra={"step": 2}) == tmp_path / "step-00000002"
    ckpt.save({"model_state": model.state_dict()}, step=3)
    assert [p.name for p in ckpt.list_checkpoints()] == ["step-00000002", "step-00000003"]
    ckpt.save_sharded(model, opt, 3)  # replaces the plain step 3
    assert read_manifest(tmp_path)[1]["state_format"] == "dcp"
    with pytest.raises(CheckpointError, match="sharded"):
        ckpt.load(3)
    ckpt.save({"model_state": model.state_dict()}, step=4)
    with pytest.raises(CheckpointError, match="plain checkpoint"):
        ckpt.load_sharded(model, opt, 4)
    # with no step given, the newest *sharded* checkpoint is loaded
    fresh, fresh_opt = _fresh()
    assert ckpt.load_sharded(fresh, fresh_opt) == {}  # step 3 was saved without extra
    _assert_same(_full_state(model, opt), _full_state(fresh, fresh_opt))


def test_newest_corrupt_checkpoint_is_skipped_with_a_warning(tmp_path: Path) -> None:
    model, opt = _trained_plain()
    ckpt = CheckpointManager(tmp_path, ctx=SINGLE)
    ckpt.save_sharded(model, opt, 1, extra={"step": 1})
    ckpt.save_sharded(model, opt, 2, extra={"step": 2})
    shard = tmp_path / "step-00000002" / "__0_0.distcp"
    _flip_byte(shard, shard.stat().st_size // 2)
    assert verify_checkpoints(tmp_path)[tmp_path / "step-00000002"]
    fresh, fresh_opt = _fresh()
    with pytest.warns(UserWarning, match="checksum mismatch"):
        assert ckpt.load_sharded(fresh, fresh_opt) == {"step": 1}
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        ckpt.load_sharded(fresh, fresh_opt, 2)


def test_a_refused_load_leaves_the_model_and_optimizer_untouched(tmp_path: Path) -> None:
    """A byte flipped in the tensor data (which DCP itself reads without complaint) is refused,
    and not one weight or moment of the target changed: a load that overlapped DCP's read into
    the live tensors with the checksums would fail this."""
    model, opt = _trained_plain()
    ckpt = CheckpointManager(tmp_path, ctx=SINGLE)
    ckpt.save_sharded(model, opt, 1)
    shard = tmp_path / "step-00000001" / "__0_0.distcp"
    weight = next(iter(model.parameters())).detach().numpy().tobytes()
    _flip_byte(shard, shard.read_bytes().index(weight[:16]) + 4)  # inside a weight's value
    fresh, fresh_opt = _fresh()
    _train(fresh, fresh_opt, rank=0)  # moments of its own, to be kept
    before = copy.deepcopy(_full_state(fresh, fresh_opt))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        ckpt.load_sharded(fresh, fresh_opt, 1)
    _assert_same(before, _full_state(fresh, fresh_opt))
    # the same file read without its checksums: DCP takes the flipped byte as a value
    _rewrite_manifest_entry(tmp_path / "step-00000001", "__0_0.distcp")
    ckpt.load_sharded(fresh, fresh_opt, 1)
    with pytest.raises(AssertionError):
        _assert_same(_full_state(model, opt), _full_state(fresh, fresh_opt))


def test_save_refuses_state_that_could_not_be_loaded(tmp_path: Path) -> None:
    model, opt = _trained_plain()
    opt.param_groups[0]["hook"] = _Touch(tmp_path / "never")
    ckpt = CheckpointManager(tmp_path, ctx=SINGLE)
    with pytest.raises(CheckpointError, match="weights_only"):
        ckpt.save_sharded(model, opt, 1)
    assert sorted(os.listdir(tmp_path)) == []  # no step dir, no temporary dir
    stale_opt = torch.optim.AdamW(_build(1).parameters())  # e.g. built before fully_shard
    with pytest.raises(CheckpointError, match="after fully_shard"):
        ckpt.save_sharded(model, stale_opt, 1)
    with pytest.raises(TypeError):
        ckpt.save_sharded(model, None, 1, extra=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ckpt.save_sharded(model, None, -1)


def test_hostile_metadata_is_not_unpickled(tmp_path: Path) -> None:
    model, opt = _trained_plain()
    CheckpointManager(tmp_path, ctx=SINGLE).save_sharded(model, opt, 1)
    step_dir = tmp_path / "step-00000001"
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Touch(marker))
    pickle.loads(payload)  # the payload works: plain pickle runs it
    assert marker.exists()
    marker.unlink()
    (step_dir / ".metadata").write_bytes(payload)
    _rewrite_manifest_entry(step_dir, ".metadata")  # the manifest now vouches for it
    assert verify_checkpoints(step_dir) == {step_dir: []}
    fresh, fresh_opt = _fresh()
    with pytest.raises(CheckpointError, match=r"pathlib\.Path\.touch"):
        CheckpointManager(tmp_path, ctx=SINGLE).load_sharded(fresh, fresh_opt)
    with pytest.raises(CheckpointError, match=r"pathlib\.Path\.touch"):
        consolidate(tmp_path, tmp_path / "out.pt")
    assert not marker.exists()
    assert not (tmp_path / "out.pt").exists()


def test_hostile_value_inside_dcp_files_is_not_unpickled(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    model, _ = _trained_plain()
    CheckpointManager(tmp_path, ctx=SINGLE).save_sharded(model, None, 1)
    step_dir = tmp_path / "step-00000001"
    marker = tmp_path / "pwned"
    for name in (".metadata", "__0_0.distcp"):
        (step_dir / name).unlink()
    with pytest.warns(UserWarning, match="single process"):  # DCP's no-process-group notice
        dcp.save({"model": model.state_dict(), "evil": _Touch(marker)}, checkpoint_id=str(step_dir))
    for name in (".metadata", "__0_0.distcp"):
        _rewrite_manifest_entry(step_dir, name)
    dcp_to_torch_save(step_dir, tmp_path / "torch.pt")  # torch's own converter runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(CheckpointError, match="refused to load 'evil'"):
        consolidate(step_dir, tmp_path / "out.pt")
    assert not marker.exists()
    assert not (tmp_path / "out.pt").exists()


def test_consolidate_plain_checkpoint_strips_wrapper_prefixes(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model, opt = _trained_plain()
    wrapped = {f"module.{k}": v for k, v in model.state_dict().items()}
    # bypass save()'s own stripping: a plain file written by an older tool
    ckpt = CheckpointManager(tmp_path / "ckpt", ctx=SINGLE)
    ckpt.save({"model_state": wrapped, "optimizer_state": opt.state_dict(), "epoch": 3}, step=7)
    out = consolidate(tmp_path / "ckpt", tmp_path / "m.safetensors")
    fresh = _build(5)
    fresh.load_state_dict(load_file(out))
    _assert_same(model.state_dict(), fresh.state_dict())
    bundle = torch.load(
        consolidate(tmp_path / "ckpt", tmp_path / "all.pth", include_optimizer=True),
        weights_only=True,
    )
    assert bundle["extra"] == {"epoch": 3}
    _assert_same(opt.state_dict(), bundle["optimizer_state"])


def test_consolidate_bad_inputs_write_nothing(tmp_path: Path) -> None:
    model, opt = _trained_plain()
    root = tmp_path / "ckpt"
    CheckpointManager(root, ctx=SINGLE).save_sharded(model, opt, 1)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "exists.pt").write_bytes(b"keep me")
    with pytest.raises(ValueError, match="unknown output type"):
        consolidate(root, out_dir / "model.bin")
    with pytest.raises(ValueError, match="weights only"):
        consolidate(root, out_dir / "model.safetensors", include_optimizer=True)
    with pytest.raises(CheckpointError, match="exists"):
        consolidate(root, out_dir / "exists.pt")
    with pytest.raises(CheckpointError, match="not a writable directory"):
        consolidate(root, tmp_path / "missing" / "model.pt")
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        consolidate(tmp_path / "nope", out_dir / "model.pt")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        consolidate(out_dir, out_dir / "model.pt")
    shard = root / "step-00000001" / "__0_0.distcp"
    _flip_byte(shard, 100)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        consolidate(root / "step-00000001", out_dir / "model.pt")
    assert sorted(os.listdir(out_dir)) == ["exists.pt"]
    assert (out_dir / "exists.pt").read_bytes() == b"keep me"
    # overwrite=True replaces atomically once the checkpoint is sound again
    _flip_byte(shard, 100)
    consolidate(root, out_dir / "exists.pt", overwrite=True)
    fresh = _build(9)
    fresh.load_state_dict(torch.load(out_dir / "exists.pt", weights_only=True))
    _assert_same(model.state_dict(), fresh.state_dict())
    assert sorted(os.listdir(out_dir)) == ["exists.pt"]


def test_find_checkpoint_and_verify_are_read_only(tmp_path: Path) -> None:
    model, opt = _trained_plain()
    CheckpointManager(tmp_path, ctx=SINGLE).save_sharded(model, opt, 1)
    stale = tmp_path / ".tmp-step-00000002-dead"
    stale.mkdir()
    (tmp_path / "step-00000003").mkdir()  # uncommitted: no manifest
    assert find_checkpoint(tmp_path) == tmp_path / "step-00000001"
    assert find_checkpoint(tmp_path / "step-00000003") == tmp_path / "step-00000003"
    results = verify_checkpoints(tmp_path)
    assert results[tmp_path / "step-00000001"] == []
    assert "missing" in results[tmp_path / "step-00000003"][0]
    assert stale.is_dir()  # nothing was cleaned up
