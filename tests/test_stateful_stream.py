"""Iterable datasets with their own ``state_dict`` / ``load_state_dict`` (torchdata's convention).

Every rank's state is saved in the checkpoint as data and given back to the same rank: a
resume at the same world size trains on exactly the samples, and ends with exactly the
weights, of the uninterrupted run; the negative control (a dataset that does not restore its
state) fails the same check. Another world size, a state that is not data, and DataLoader
workers are refused in one line.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset

from dist_harness import REPO_ROOT, run_python
from gpu_training.config import ConfigError, TrainingConfig
from gpu_training.ddp import DistributedContext
from gpu_training.job import load_job
from gpu_training.preflight import check_launch
from gpu_training.stateful_stream import StatefulPosition, check_data_state, check_saved_world_size
from gpu_training.streaming import StreamPosition
from gpu_training.train_data import build_train_data
from resume_jobs import weights
from stream_task import read_steps, stream_job, write_stream
from train_jobs import train


class _Counter(IterableDataset[int]):
    """0, 1, 2... that keeps its own position (a tensor in the state too)."""

    def __init__(self, n: int, *, forget: bool = False, extra: Any = None) -> None:
        self.n, self.next, self.forget, self.extra = n, 0, forget, extra

    def __iter__(self) -> Iterator[int]:
        while self.next < self.n:
            self.next += 1
            yield self.next - 1
        self.next = 0

    def state_dict(self) -> dict[str, Any]:
        state = {"next": self.next, "seen": torch.tensor([self.next])}
        return state if self.extra is None else {**state, "extra": self.extra}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.forget:
            self.next = int(state["next"])


CFG = TrainingConfig(global_batch_size=4, per_device_batch_size=2, max_steps=10)


def _batches(data: Any, n: int) -> list[list[int]]:
    it = iter(data.loader)
    return [next(it).tolist() for _ in range(n)]


def _through_a_file(state: dict[str, Any]) -> Any:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


def test_the_position_carries_the_datasets_state_through_a_checkpoint_file() -> None:
    whole = _batches(build_train_data(_Counter(100), CFG, DistributedContext()), 8)
    first = build_train_data(_Counter(100), CFG, DistributedContext())
    assert _batches(first, 4) == whole[:4]  # two optimizer steps
    state = _through_a_file(first.position.state_dict())
    assert state["ranks"][0]["next"] == 8 and state["position"] == 2 and state["world_size"] == 1
    resumed = build_train_data(_Counter(100), CFG, DistributedContext())
    resumed.position.load_state_dict(state)
    assert _batches(resumed, 4) == whole[4:]
    # the negative control: a dataset that does not restore its state starts over
    forgot = build_train_data(_Counter(100, forget=True), CFG, DistributedContext())
    forgot.position.load_state_dict(state)
    assert _batches(forgot, 4) == whole[:4] != whole[4:]


def test_a_hugging_face_streaming_dataset_resumes_through_its_own_state(tmp_path: Path) -> None:
    """``datasets.IterableDataset`` keeps its state torchdata's way: no adapter needed."""
    datasets = pytest.importorskip("datasets")
    lines = write_stream(tmp_path / "s.jsonl", 60)

    def stream() -> Any:
        ds = datasets.load_dataset("json", data_files=str(lines), split="train", streaming=True)
        return ds.select_columns(["id"])

    def ids(data: Any, n: int) -> list[list[int]]:
        it = iter(data.loader)
        return [next(it)["id"].tolist() for _ in range(n)]

    whole = ids(build_train_data(stream(), CFG, DistributedContext()), 8)
    assert whole[:2] == [[0, 1], [2, 3]]
    first = build_train_data(stream(), CFG, DistributedContext())
    assert ids(first, 4) == whole[:4]
    state = _through_a_file(first.position.state_dict())
    resumed = build_train_data(stream(), CFG, DistributedContext())
    resumed.position.load_state_dict(state)
    assert ids(resumed, 4) == whole[4:]
    restarted = build_train_data(stream(), CFG, DistributedContext())  # the negative control
    assert ids(restarted, 4) == whole[:4] != whole[4:]


def test_refusals_are_one_line() -> None:
    ctx = DistributedContext()
    position = StatefulPosition(_Counter(10), ctx, 4)
    on_two = {**position.state_dict(), "world_size": 2}
    with pytest.raises(ConfigError, match=r"_Counter's own state on each of 2 ranks and this run"):
        position.load_state_dict(on_two)
    with pytest.raises(ConfigError, match="not such a stream's"):
        position.load_state_dict(StreamPosition(4).state_dict())
    with pytest.raises(ConfigError, match="another kind of stream's"):
        StreamPosition(4).load_state_dict(position.state_dict())
    with pytest.raises(ConfigError, match="loader workers to 0"):
        build_train_data(_Counter(10), CFG, ctx, workers=2)
    # an object in the state: refused when the data is built, naming the dataset and the key
    bad = _Counter(10, extra={"files": ["a", {"handle": object()}]})
    with pytest.raises(
        ConfigError, match=r"_Counter: state_dict\(\) holds a value of type object at "
    ):
        build_train_data(bad, CFG, ctx)
    with pytest.raises(ConfigError, match=r"at 'extra.files\[1\].handle'"):
        check_data_state("_Counter", bad.state_dict())
    with pytest.raises(ConfigError, match="the key 3 at 'extra'"):
        check_data_state("_Counter", {"extra": {3: 1}})


# --- real runs: the Trainer on 2 ranks, each rank's state saved and restored ----------------

G, B, STEPS = 8, 2, 6


def _job(tmp: Path, out: Path, stream: Path, **options: Any) -> Path:
    return stream_job(
        tmp, out, stream, "stateful_task", global_batch=G, per_device=B, steps=STEPS, **options
    )


def _run(path: Path, out: Path, *args: str) -> list:
    live = path.parent / "ids_live"
    shutil.rmtree(live, ignore_errors=True)
    live.mkdir()
    train(path, 2, *args)
    shutil.move(live, out / "ids")
    return read_steps(out / "ids", 2, G // (2 * B))


def _resume_copy(tmp: Path, run: Path, name: str, stream: Path, **options: Any) -> Path:
    out = tmp / name
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("step-00000006", "ids"))
    return _job(tmp, out, stream, **options)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list]:
    """6 steps on 2 ranks, a checkpoint every 3: the stream, the run dir, ids per step."""
    tmp = tmp_path_factory.mktemp("stateful")
    stream = write_stream(tmp / "stream.jsonl", 200)
    run = tmp / "run"
    whole = _run(_job(tmp, run, stream), run)
    ids = [sorted(i for rank in step for i in rank) for step in whole]
    assert ids == [list(range(k * G, (k + 1) * G)) for k in range(STEPS)]  # rank r: i % 2 == r
    return stream, run, whole


@pytest.mark.slow
@pytest.mark.multirank
def test_a_stateful_stream_resumes_exactly_on_the_same_world_size(
    uninterrupted: tuple[Path, Path, list],
) -> None:
    stream, run, whole = uninterrupted
    tmp = run.parent
    same = tmp / "same"
    assert _run(_resume_copy(tmp, run, "same", stream), same) == whole[3:]
    final, resumed = weights(run, STEPS), weights(same, STEPS)
    assert all(torch.equal(final[k], resumed[k]) for k in final)


@pytest.mark.matrix
@pytest.mark.multirank
def test_a_stateful_stream_through_the_cli_not_restored_or_on_one_rank(
    uninterrupted: tuple[Path, Path, list],
) -> None:
    """Through the CLI: the negative control, and the refusal on another world size (make
    test runs both in process above; the refusal's exit path is the one of
    test_streaming.py's stream without a protocol)."""
    stream, run, whole = uninterrupted
    tmp = run.parent
    forgot = tmp / "forgot"
    job = _resume_copy(tmp, run, "forgot", stream, forget=True)
    assert _run(job, forgot, "--allow-config-change") == whole[:3] != whole[3:]
    final, again = weights(run, STEPS), weights(forgot, STEPS)
    assert not all(torch.equal(final[k], again[k]) for k in final)

    # another world size: one line, exit 2, nothing written
    one = tmp / "one"
    path = _resume_copy(tmp, run, "one", stream)
    (tmp / "ids_live").mkdir(exist_ok=True)
    before = {p: p.stat().st_mtime_ns for p in one.rglob("*") if p.is_file()}
    refused = run_python(["-m", "gpu_training", "train", str(path)], timeout=180, cwd=REPO_ROOT)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "own state on each of 2 ranks and this run has 1" in lines[0]
    assert {p: p.stat().st_mtime_ns for p in one.rglob("*") if p.is_file()} == before


_NO_WORKERS = """
import sys
import gpu_training.launcher.torchrun as torchrun

def started(*args, **kwargs):  # what would start torchrun's workers: say so, exit 99
    print("WORKERS STARTED", flush=True)
    sys.exit(99)

torchrun.run_here = started
from gpu_training.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _snapshot(folder: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.multirank
def test_another_world_size_is_refused_before_any_process_starts(
    uninterrupted: tuple[Path, Path, list],
) -> None:
    """``train --nproc 4`` on the 2-rank checkpoint: one line, exit 2, nothing written, and
    torchrun's workers never started (the launcher's start is replaced by an exit 99)."""
    stream, run, _ = uninterrupted
    tmp = run.parent
    out = tmp / "four"
    path = _resume_copy(tmp, run, "four", stream)
    (tmp / "ids_live").mkdir(exist_ok=True)
    before = _snapshot(out)
    argv = ["-c", _NO_WORKERS, "train", str(path), "--nproc", "4"]
    refused = run_python(argv, timeout=180, cwd=REPO_ROOT)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "WORKERS STARTED" not in refused.stdout
    lines = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, refused.stderr
    assert "StatefulLines's own state on each of 2 ranks and this run has 4" in lines[0]
    assert _snapshot(out) == before  # the run directory and its checkpoints unchanged
    # the positive control: on the world size that saved it, the launch check passes (its
    # warnings: the job file's record_dir, which is no math setting, moved)
    check_launch(load_job(path), 2)


@pytest.mark.parametrize("world_size", [None, "2", True])
def test_a_damaged_position_is_one_line_not_a_traceback(world_size: object) -> None:
    """Per-rank states without a usable saved world size: a ConfigError, not a KeyError."""
    position: dict[str, object] = {"stream": 2, "ranks": [{}, {}]}
    if world_size is not None:
        position["world_size"] = world_size
    with pytest.raises(ConfigError, match="without the world size that saved them"):
        check_saved_world_size(position, 2)
    check_saved_world_size({"stream": 2, "world_size": 2, "ranks": [{}, {}]}, 2)  # fine
