"""``run.trackers``: W&B (offline) and MLflow (local file store) record what ``metrics.jsonl``
holds, continue the same runs after a kill, and never stop training when they fail.

Everything is real: a Trainer job in this process, W&B's own offline transaction log read
with W&B's own record schema, MLflow's store read with ``MlflowClient``.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from gpu_training.config import ConfigError
from gpu_training.job import JobConfig, TrackerSpec
from gpu_training.reporting import MetricsWriter, read_metrics
from gpu_training.trainer import Trainer
from train_jobs import train as train_job

pytestmark = pytest.mark.timeout(180)

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")  # the trackers extra
mlflow_tracking = pytest.importorskip("mlflow.tracking")

# Metrics a resumed run computes again bit for bit (exact resume); the throughput ones are
# timings, different on every run.
_EXACT = {"loss", "lr", "grad_norm", "skipped_steps", "ppl"}


@pytest.fixture(scope="module", autouse=True)
def _wandb_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """W&B's own logs and settings in a temporary directory, not the user's home."""
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            patch.setenv(name, str(home / name.lower()))
        yield


def _job(out: Path, *, max_steps: int = 4, trackers: list[Any] | None = None) -> JobConfig:
    return JobConfig.from_dict(
        {
            "task": "charlm",
            "task_options": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
            "training": {
                "global_batch_size": 8,
                "per_device_batch_size": 4,
                "max_steps": max_steps,
                "learning_rate": 3e-3,
                "precision": "fp32",
            },
            "strategy": {"name": "none"},
            "checkpoint": {"every": 2, "keep_last_n": 5},
            "run": {
                "output_dir": str(out),
                "log_every": 1,
                "eval_every": 2,
                "eval_batches": 1,
                "progress": False,
                "plot": False,
                "trackers": trackers or ["jsonl", "wandb", "mlflow"],
            },
        }
    )


# --- reading the trackers back with their own formats --------------------------------------


def _wandb_records(path: Path) -> Iterator[Any]:
    """The records of a ``.wandb`` transaction log: W&B's LevelDB-style log of protobufs
    (7-byte file header, 32 KiB blocks, 7-byte chunk headers: CRC32, length, type)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: a whole record
            record = wandb_pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _wandb_segments(out: Path) -> list[dict[str, Any]]:
    """Each offline start of the run, oldest first: id, history rows by step, config."""
    segments = []
    for run_dir in sorted((out / "wandb").glob("offline-run-*")):
        rows: dict[int, dict[str, float]] = {}
        config: dict[str, Any] = {}
        run_id = None
        for record in _wandb_records(next(run_dir.glob("run-*.wandb"))):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
            elif kind == "config":
                config.update({u.key: json.loads(u.value_json) for u in record.config.update})
            elif kind == "history":
                items = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
                step = int(items.pop("_step"))
                assert step not in rows, f"step {step} twice in {run_dir.name}"
                rows[step] = {k: json.loads(v) for k, v in items.items() if not k.startswith("_")}
        segments.append({"dir": run_dir, "id": run_id, "rows": rows, "config": config})
    return segments


def _expected(out: Path) -> dict[str, dict[int, float]]:
    """``split/key`` -> step -> value, from ``metrics.jsonl`` (each step once)."""
    series: dict[str, dict[int, float]] = {}
    for record in read_metrics(out / "metrics.jsonl"):
        for key, value in record.items():
            if key not in ("split", "step"):
                by_step = series.setdefault(f"{record['split']}/{key}", {})
                assert record["step"] not in by_step, f"metrics.jsonl: {key} twice"
                by_step[record["step"]] = value
    return series


def _mlflow(out: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's opt-in to file stores
    return mlflow_tracking.MlflowClient(tracking_uri=(out / "mlruns").as_uri())


def _mlflow_series(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _kept_ids(out: Path, step: int) -> dict[str, str]:
    state = torch.load(
        out / "checkpoints" / f"step-{step:08d}" / "state.pt", map_location="cpu", weights_only=True
    )
    return dict(state["extra"]["trackers"])


# --- the job field --------------------------------------------------------------------------


def test_the_field_defaults_checks_and_round_trips() -> None:
    default = JobConfig.from_dict({})
    assert [t.name for t in default.run.trackers] == ["jsonl", "tensorboard"]
    assert default.run.tensorboard is True
    off = JobConfig.from_dict({"run": {"tensorboard": False}})  # the older switch still works
    assert [t.name for t in off.run.trackers] == ["jsonl"] and off.run.tensorboard is False
    picked = JobConfig.from_dict(
        {"run": {"trackers": ["jsonl", {"name": "mlflow", "tracking_uri": "http://mlflow:5000"}]}}
    )
    assert picked.run.tensorboard is False  # not listed: no events
    assert picked.to_dict()["run"]["trackers"] == [
        "jsonl",
        {"name": "mlflow", "tracking_uri": "http://mlflow:5000"},
    ]
    assert JobConfig.from_dict(picked.to_dict()) == picked
    assert picked.run.trackers[1] == TrackerSpec("mlflow", tracking_uri="http://mlflow:5000")


@pytest.mark.parametrize(
    ("trackers", "words"),
    [
        (["jsonl", "wandbb"], "unknown tracker 'wandbb' (did you mean 'wandb'?)"),
        ([{"name": "mlfow"}], "(did you mean 'mlflow'?)"),
        ([{"name": "wandb", "projet": "x"}], "unknown option 'projet' in entry 0 (did you mean"),
        ([{"name": "jsonl", "project": "x"}], "project is for wandb and mlflow"),
        ([{"name": "wandb", "mode": "cloud"}], "expected one of offline, online, got 'cloud'"),
        (["wandb", "wandb"], "'wandb' is listed twice"),
        ("wandb", "expected a list of tracker names"),
        ([{"project": "x"}], "entry 0 has no 'name'"),
    ],
)
def test_bad_trackers_are_one_line_naming_the_field(trackers: Any, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        JobConfig.from_dict({"run": {"trackers": trackers}}, source="job.yaml")
    message = str(info.value)
    assert message.startswith("job.yaml: field 'run.trackers': ") and "\n" not in message
    assert words in message and info.value.field == "run.trackers"


# --- a run with both trackers ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tracked")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(_job(out), quiet=True).fit()
    assert not _tracker_warnings(caught), "a tracker failed"
    return out


def _tracker_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, RuntimeWarning) and str(w.message).startswith("tracker '")
    ]


def test_wandb_offline_run_holds_the_metrics_and_the_job(tracked_run: Path) -> None:
    (segment,) = _wandb_segments(tracked_run)
    assert segment["dir"].name.endswith(f"-{segment['id']}")  # offline-run-<time>-<id>
    expected = _expected(tracked_run)
    logged = {
        key: {step: row[key] for step, row in segment["rows"].items() if key in row}
        for key in expected
    }
    assert logged == expected  # every metric, at every step, the same float
    assert set(segment["rows"]) == {1, 2, 3, 4}
    assert segment["config"]["job"] == json.loads(json.dumps(_job(tracked_run).to_dict()))
    env = segment["config"]["environment"]
    assert env["torch"] == torch.__version__ and env["world_size"] == 1
    assert {"python", "gpu_training", "cuda", "hostname"} <= set(env)
    assert _kept_ids(tracked_run, 2)["wandb"] == segment["id"] == _kept_ids(tracked_run, 4)["wandb"]


def test_mlflow_run_holds_the_metrics_and_the_job(
    tracked_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _mlflow(tracked_run, monkeypatch)
    run_id = _kept_ids(tracked_run, 4)["mlflow"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == tracked_run.name
    for key, by_step in _expected(tracked_run).items():
        assert _mlflow_series(client, run_id, key) == sorted(by_step.items()), key
    params = run.data.params
    assert params["job.training.learning_rate"] == "0.003"
    assert params["job.run.trackers"] == '["jsonl", "wandb", "mlflow"]'
    assert params["environment.torch"] == torch.__version__
    assert params["environment.world_size"] == "1"


# --- killed and resumed ---------------------------------------------------------------------


class _Killed(Exception):
    pass


class _KillAfterCheckpoint:
    """Stops the job right after the checkpoint of ``step``, as a crash would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_checkpoint(self, trainer: Trainer, path: Path | None) -> None:
        if trainer.state.step == self.step:
            raise _Killed(f"killed at step {self.step}")


def test_a_killed_and_resumed_run_continues_the_same_tracker_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    with pytest.raises(_Killed):
        Trainer(_job(out, max_steps=6), quiet=True, callbacks=[_KillAfterCheckpoint(4)]).fit()
    kept = _kept_ids(out, 2)
    client = _mlflow(out, monkeypatch)
    assert client.get_run(kept["mlflow"]).info.status == "FAILED"  # the crash is on record
    # The kill came before the step-4 checkpoint was durable: resume from step 2, and the
    # trackers have already seen steps 3 and 4.
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = Trainer(_job(out, max_steps=6), quiet=True).fit()
    assert summary["step"] == 6 and not _tracker_warnings(caught)
    assert _kept_ids(out, 6) == kept  # the same runs, to the end

    expected = _expected(out)
    assert sorted(expected["train/loss"]) == [1, 2, 3, 4, 5, 6]
    first, second = _wandb_segments(out)
    assert first["id"] == second["id"] == kept["wandb"]
    assert set(first["rows"]) == {1, 2, 3, 4} and set(second["rows"]) == {5, 6}  # none twice
    rows = {**first["rows"], **second["rows"]}
    for key, by_step in expected.items():
        if key.split("/")[1] in _EXACT:
            assert {s: rows[s][key] for s in by_step} == by_step, key

    run = client.get_run(kept["mlflow"])
    assert run.info.status == "FINISHED"
    for key, by_step in expected.items():
        series = _mlflow_series(client, kept["mlflow"], key)
        assert [s for s, _ in series] == sorted(by_step), f"{key}: each step once"
        if key.split("/")[1] in _EXACT:
            assert series == sorted(by_step.items()), key


# --- trackers that fail ---------------------------------------------------------------------


class _DeleteStoreAt:
    """Removes MLflow's store under the running job: its next write raises."""

    def __init__(self, store: Path, step: int) -> None:
        self.store, self.step = store, step

    def on_log(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        if trainer.state.step == self.step:
            shutil.rmtree(self.store)


def test_failing_trackers_warn_once_and_the_run_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = Trainer(
            _job(out), quiet=True, callbacks=[_DeleteStoreAt(out / "mlruns", 2)]
        ).fit()
    assert summary["step"] == 4
    messages = _tracker_warnings(caught)
    assert len([m for m in messages if "'wandb'" in m]) == 1, messages
    assert len([m for m in messages if "'mlflow'" in m]) == 1, messages
    (wandb_line,) = (m for m in messages if "'wandb'" in m)
    assert "could not start" in wandb_line and "gpu-training[trackers]" in wandb_line
    (mlflow_line,) = (m for m in messages if "'mlflow'" in m)
    assert "failed at step 2" in mlflow_line and "training goes on" in mlflow_line
    assert sorted(_expected(out)["train/loss"]) == [1, 2, 3, 4]  # metrics.jsonl is whole
    assert set(_kept_ids(out, 4)) == {"mlflow"}  # kept: a resume may continue it


def test_warnings_made_errors_still_do_not_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # python -W error::RuntimeWarning
        summary = Trainer(_job(tmp_path / "run", trackers=["jsonl", "wandb"]), quiet=True).fit()
    assert summary["step"] == 4
    assert "warning: tracker 'wandb' could not start" in capsys.readouterr().err


# --- rank 0 only, and the sharded checkpoint's extra ----------------------------------------


def test_other_ranks_start_no_tracker_and_pass_the_kept_ids_on(tmp_path: Path) -> None:
    specs = _job(tmp_path).run.trackers
    writer = MetricsWriter(
        tmp_path / "out", enabled=False, trackers=specs, run_ids={"mlflow": "abc"}
    )
    writer.write("train", 1, {"loss": 1.0})
    writer.close()
    assert not (tmp_path / "out").exists()  # nothing written, nothing started
    assert writer.run_ids == {"mlflow": "abc"} and writer.trackers == ""


@pytest.mark.multirank
def test_two_rank_fsdp_job_has_one_mlflow_run_kept_in_the_sharded_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    job = _job(out, trackers=["jsonl", "mlflow"]).to_dict()
    job["strategy"] = {"name": "fsdp"}
    job["task_options"]["n_layer"] = 2  # FSDP wraps repeated blocks: two at least
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))

    def train() -> None:
        stdout = train_job(config, 2, timeout=240)
        assert stdout.count("trackers: mlflow (") == 1  # rank 0 announces, alone

    def kept(step: int) -> dict[str, str]:
        path = out / "checkpoints" / f"step-{step:08d}" / "extra.pt"
        return dict(torch.load(path, weights_only=True)["trackers"])

    train()
    run_id = kept(2)["mlflow"]
    shutil.rmtree(out / "checkpoints" / "step-00000004")  # resume from step 2
    train()
    assert kept(4) == {"mlflow": run_id}
    client = _mlflow(out, monkeypatch)
    (experiment,) = [e for e in client.search_experiments() if e.name == "gpu-training"]
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # one run: rank 1 started none
    for key, by_step in _expected(out).items():
        assert [s for s, _ in _mlflow_series(client, run_id, key)] == sorted(by_step), key
