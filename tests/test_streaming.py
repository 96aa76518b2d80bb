"""Streaming data resumes exactly: the global sample cursor, traced by sample id.

A stream is one global sequence; global step ``k`` consumes samples ``[k·G, (k+1)·G)`` on any
world size and DataLoader worker count. Checked on the components (ranks simulated in one
process, real DataLoader workers) and on real runs of the built-in JSONL reader through the
Trainer: an uninterrupted run on 2 ranks against its step-3 checkpoint resumed on 2 ranks
(the same ids per rank and step, the same weights bitwise), on 1 and on 4 (no id repeated or
skipped); the negative control restarts the stream and fails the same check.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from dist_harness import REPO_ROOT, run_python
from gpu_training.config import ConfigError, TrainingConfig
from gpu_training.ddp import DistributedContext
from gpu_training.job import load_job
from gpu_training.preflight import check_launch
from gpu_training.streaming import RangeStream
from gpu_training.tasks import resolve_task
from gpu_training.tasks.streams import FileStream, HFStream
from gpu_training.train_data import build_train_data
from resume_jobs import weights
from stream_task import flat, read_steps, simulated_steps, stream_job, write_stream
from train_jobs import train

G, B = 8, 2


class _Restart:
    """The negative control of the component test: every pass starts at sample 0."""

    def __init__(self, n: int) -> None:
        self.base = RangeStream(n)

    def records(self, start: int) -> Any:
        return self.base.records(0)

    def decode(self, record: Any) -> Any:
        return record


def _steps(stream: Any, world: int, workers: int, steps: int, state: Any = None) -> tuple:
    """``steps`` global steps on ``world`` simulated ranks: per step, per rank, the ids."""
    return simulated_steps(
        stream,
        world,
        workers,
        steps,
        state,
        global_batch=G,
        per_device=B,
        ids=lambda batch: batch.tolist(),
    )


@pytest.mark.parametrize("world,workers", [(1, 0), (2, 2), (4, 1)])
def test_cursor_resumes_on_any_world_size(world: int, workers: int) -> None:
    first, state = _steps(RangeStream(200), 2, 2, 3)
    assert [flat(s) for s in first] == [list(range(k * G, (k + 1) * G)) for k in range(3)]
    assert state["cursor"] == 3 * G
    rest, _ = _steps(RangeStream(200), world, workers, 3, state)
    # the same global batches, split rank-major as the map-style sampler splits indices
    assert [flat(s) for s in rest] == [list(range(k * G, (k + 1) * G)) for k in range(3, 6)]
    restarted, _ = _steps(_Restart(200), world, workers, 3, state)  # the negative control
    assert [flat(s) for s in restarted] != [flat(s) for s in rest]


def test_finite_stream_ends_on_every_rank_alike() -> None:
    cfg = TrainingConfig(global_batch_size=G, per_device_batch_size=B, max_steps=9)
    cfg = cfg.for_world_size(2)
    got = []
    for rank in range(2):
        ctx = DistributedContext(rank=rank, local_rank=rank, world_size=2, local_world_size=2)
        data = build_train_data(RangeStream(2 * G + 5), cfg, ctx, workers=2)
        got.append(len(list(data.loader)))  # 2 steps × A micro-batches; the tail dropped
        assert data.position.state_dict()["position"] == 2
    assert got == [4, 4]
    data.position.set_epoch(1)  # the Trainer's next epoch: the stream again from its start
    assert next(iter(data.loader)).tolist() == [4, 5]  # rank 1's first micro-batch
    assert data.position.state_dict()["epoch"] == 1


def _files(tmp_path: Path) -> list[Path]:
    j = tmp_path / "a.jsonl"
    j.write_text("".join(json.dumps({"text": f"j{i}"}) + "\n" for i in range(7)))
    t = tmp_path / "b.txt"
    t.write_text("".join(f"t{i}\n" for i in range(5)) + "t5")  # no newline at the end
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [f"p{i}" for i in range(9)]}), p, row_group_size=4)
    return [j, t, p]


def test_file_stream_reopens_at_any_index(tmp_path: Path) -> None:
    stream = FileStream(_files(tmp_path), encode=str)
    every = [stream.decode(r) for r in stream.records(0)]
    assert every == [f"j{i}" for i in range(7)] + [f"t{i}" for i in range(6)] + [
        f"p{i}" for i in range(9)
    ]
    for start in (1, 7, 8, 13, 14, 17, 21, 22, 40):
        assert [stream.decode(r) for r in stream.records(start)] == every[start:], start


def test_bad_record_is_one_line_with_workers(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\nnot json\n{"text": "d"}\n')
    cfg = TrainingConfig(global_batch_size=2, per_device_batch_size=1, max_steps=9)
    for workers in (0, 2):
        data = build_train_data(
            FileStream([path], encode=len), cfg, DistributedContext(), workers=workers
        )
        with pytest.raises(ConfigError) as err:
            list(data.loader)
        assert str(err.value).startswith(f"stream {path}, line 3: not JSON"), str(err.value)
        assert "\n" not in str(err.value)


@pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="needs datasets")
def test_hf_stream_matches_and_ignores_worker_sharding(tmp_path: Path) -> None:
    for kind, make in (("jsonl", 0), ("parquet", 2)):
        files = [f for f in _files(tmp_path) if f.suffix.endswith(kind)]
        extra = tmp_path / f"d.{kind}"
        shutil.copy(files[0], extra)  # two files: datasets would split them over workers
        mine, theirs = (
            FileStream([*files, extra], encode=str),
            HFStream([*files, extra], encode=str),
        )
        every = [mine.decode(r) for r in mine.records(0)]
        for start in (0, 3, 9):
            assert [theirs.decode(r) for r in theirs.records(start)] == every[start:]
        cfg = TrainingConfig(global_batch_size=2, per_device_batch_size=1, max_steps=9)
        one = build_train_data(theirs, cfg, DistributedContext(), workers=make)
        assert [x for b in one.loader for x in b] == every[: len(every) // 2 * 2]
    # the built-in task reads the same samples through either reader
    lines = tmp_path / "lines.jsonl"
    write_stream(lines, 5)
    samples = []
    for reader in ("files", "hf"):
        options = {"stream": str(lines), "stream_reader": reader, "block_size": 16}
        train_set, _ = resolve_task("charlm", options).build_data()
        samples.append([train_set.decode(r) for r in train_set.records(2)])
    assert len(samples[0]) == 3
    pairs = zip(samples[0], samples[1], strict=True)
    assert all(torch.equal(a, b) for x, y in pairs for a, b in zip(x, y, strict=True))


# --- real runs: the Trainer on the built-in JSONL reader ------------------------------------

STEPS = 6


def _job(tmp: Path, out: Path, stream: Path) -> Path:
    return stream_job(
        tmp,
        out,
        stream,
        "recording_task",
        global_batch=G,
        per_device=B,
        steps=STEPS,
        stream_workers=2,
    )


def _train_recorded(path: Path, world: int, out: Path, *args: str) -> str:
    """``train`` with the ids the ranks trained on moved to ``out/ids`` after it."""
    live = path.parent / "ids_live"
    shutil.rmtree(live, ignore_errors=True)
    live.mkdir()
    printed = train(path, world, *args)
    shutil.move(live, out / "ids")
    return printed


def _resume(tmp: Path, run: Path, name: str, world: int, *sets: str) -> tuple[list, Path]:
    """``run``'s step-3 checkpoint resumed on ``world`` ranks; its steps 4..6 and output dir."""
    out = tmp / name
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("step-00000006", "ids"))
    job = yaml.safe_load((tmp / f"{run.name}.yaml").read_text())
    job["run"]["output_dir"] = str(out)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    # no --allow-config-change: neither the world size nor the worker count is the math
    printed = _train_recorded(path, world, out, *sets)
    assert "resumed from" in printed
    return read_steps(out / "ids", world, G // (world * B)), out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """6 steps on 2 ranks, 2 workers each, a checkpoint every 3: its dir and ids per step."""
    tmp = tmp_path_factory.mktemp("stream")
    stream = write_stream(tmp / "stream.jsonl", 100)
    run = tmp / "run"
    _train_recorded(_job(tmp, run, stream), 2, run)
    whole = read_steps(run / "ids", 2, 2)
    assert [sorted(flat(s)) for s in whole] == [
        list(range(k * G, (k + 1) * G)) for k in range(STEPS)
    ]
    return run, whole


def _other_world_size(run: Path, whole: list, world: int, workers: int) -> None:
    """Resumed on ``world`` ranks: per step the same global set, no id repeated or skipped."""
    sets = ("--set", f"task_options.stream_workers={workers}")
    other, out = _resume(run.parent, run, f"w{world}", world, *sets)
    assert [sorted(flat(s)) for s in other] == [sorted(flat(s)) for s in whole[3:]]
    consumed = Counter(i for s in whole[:3] + other for i in flat(s))
    assert consumed == Counter(range(STEPS * G))
    final, resumed = weights(run, STEPS), weights(out, STEPS)
    assert max((resumed[k] - final[k]).abs().max().item() for k in final) < 1e-5


@pytest.mark.slow
@pytest.mark.multirank
def test_trainer_stream_resumes_exactly(uninterrupted: tuple[Path, list]) -> None:
    run, whole = uninterrupted
    tmp = run.parent
    # the same world size, another worker count: the same ids per rank and step, bitwise
    same, out = _resume(tmp, run, "same", 2, "--set", "task_options.stream_workers=3")
    assert same == whole[3:]
    final, resumed = weights(run, STEPS), weights(out, STEPS)
    assert all(torch.equal(final[k], resumed[k]) for k in final)

    _other_world_size(run, whole, 1, 0)

    # the negative control: a resume that restarts the stream from its beginning
    sets = ("--allow-config-change", "--set", "task_options.restart=true")
    again, _ = _resume(tmp, run, "restart", 2, *sets)
    assert again != whole[3:]
    assert Counter(i for s in whole[:3] + again for i in flat(s)) != Counter(range(STEPS * G))


@pytest.mark.matrix
@pytest.mark.multirank
def test_trainer_stream_resumes_on_four_ranks(uninterrupted: tuple[Path, list]) -> None:
    _other_world_size(*uninterrupted, 4, 1)


def test_stream_without_protocol_refuses_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "plain"
    job = {
        "task": {"model": "stream_task:plain_model", "data": "stream_task:plain_data"},
        "training": {"global_batch_size": 4, "per_device_batch_size": 4, "max_steps": 2},
        "strategy": {"name": "none"},
        "run": {"output_dir": str(out), "plot": False, "tensorboard": False, "progress": False},
    }
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(job))
    cmd = ["-m", "gpu_training", "train", str(path)]
    first = run_python(cmd, timeout=180, cwd=REPO_ROOT)
    assert first.returncode == 0, first.stderr[-2000:]
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = run_python(cmd, timeout=180, cwd=REPO_ROOT)
    assert again.returncode == 2, again.stdout + again.stderr
    lines = [ln for ln in again.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "without a resume protocol" in lines[0], again.stderr
    after = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing removed
    # the launch check says it before any process starts, from the checkpoint alone
    with pytest.raises(ConfigError, match=r"_Plain has no records\(start\)/decode\(record\)"):
        check_launch(load_job(path), 1)


class _Pairs:
    """A stream of ``(x, y)`` regression samples; sample ``i`` is a function of ``i`` only."""

    def records(self, start: int) -> Any:
        return iter(range(start, 10_000))

    def decode(self, record: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(record)
        return torch.randn(4, generator=g), torch.randn(2, generator=g)


def _loop_run(state: Any, max_steps: int, model_state: Any = None) -> tuple[Any, Any, Any]:
    from gpu_training.amp import MixedPrecisionStepper
    from gpu_training.ddp import train_one_epoch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if model_state is not None:
        model.load_state_dict(model_state[0])
        optimizer.load_state_dict(model_state[1])
    cfg = TrainingConfig(global_batch_size=G, per_device_batch_size=B, max_steps=99)
    data = build_train_data(_Pairs(), cfg, DistributedContext(), workers=1)
    if state is not None:
        data.position.load_state_dict(state)
    stepper = MixedPrecisionStepper(optimizer, "fp32", cfg.gradient_accumulation_steps)
    loss = torch.nn.functional.mse_loss
    train_one_epoch(
        model, data.loader, stepper, loss, DistributedContext(), epoch=0, max_steps=max_steps
    )
    return data.position.state_dict(), model.state_dict(), optimizer.state_dict()


def test_helper_loop_resumes_a_stream() -> None:
    """``ddp.train_one_epoch`` over a stream: 2 steps, saved, 2 more = 4 uninterrupted."""
    _, whole, _ = _loop_run(None, 4)
    state, model, optimizer = _loop_run(None, 2)
    assert state["cursor"] == 2 * G
    _, resumed, _ = _loop_run(state, 2, (model, optimizer))
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    _, restarted, _ = _loop_run(None, 2, (model, optimizer))  # the stream from its start
    assert not all(torch.equal(whole[k], restarted[k]) for k in whole)
