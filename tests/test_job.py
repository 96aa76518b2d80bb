"""JobConfig: the sections of a job file, their validation, overrides and hashing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_training.config import ConfigError
from gpu_training.job import JobConfig, load_job

SRC = Path(__file__).resolve().parents[1] / "src"


def _job(**sections: object) -> JobConfig:
    return JobConfig.from_dict(sections, source="job.yaml")


def test_defaults_and_round_trip() -> None:
    job = _job(
        task="charlm",
        task_options={"n_layer": 2},
        training={"global_batch_size": 32, "per_device_batch_size": 8, "max_steps": 5},
        strategy={"name": "fsdp", "block_classes": ["Block"], "activation_checkpointing": True},
        checkpoint={"every": 2, "keep_last_n": 1},
        run={"output_dir": "runs/x"},
    )
    assert job.task.name == "charlm" and job.task.options == {"n_layer": 2}
    assert job.training.for_world_size(4).gradient_accumulation_steps == 1
    assert job.checkpoint_dir == Path("runs/x/checkpoints")
    assert JobConfig.from_dict(job.to_dict()) == job


def test_user_task_from_import_strings() -> None:
    job = _job(task={"model": "mypkg.models:build", "data": "mypkg.data:build"})
    assert job.task.name is None and job.task.model == "mypkg.models:build"


def test_config_hash_ignores_world_size_but_not_math() -> None:
    base = {"training": {"global_batch_size": 32, "per_device_batch_size": 4}}
    a = _job(**base)
    b = JobConfig.from_dict(a.to_dict() | {"training": a.training.for_world_size(4).to_dict()})
    assert a.config_hash() == b.config_hash()
    c = _job(training={"global_batch_size": 64, "per_device_batch_size": 4})
    assert a.config_hash() != c.config_hash()


def test_stream_workers_are_not_the_math_but_older_hashes_still_match() -> None:
    """How many DataLoader workers read a stream is not in the hash (any count feeds a step
    the same samples; tests/test_streaming.py resumes at another count through the CLI); a
    manifest hashed while it counted still matches, and the change is listed as not math."""
    two = _job(task_options={"stream": "s.jsonl", "stream_workers": 2})
    three = _job(task_options={"stream": "s.jsonl", "stream_workers": 3})
    assert two.config_hash() == three.config_hash()
    assert three.changes_since(two.to_dict()) == ([], ["task_options.stream_workers: 2 -> 3"])
    # a manifest hashed while the count was math: recognised at its own count only
    assert two.config_hashes()[-1] not in (two.config_hash(), three.config_hashes()[-1])
    other = _job(task_options={"stream": "other.jsonl", "stream_workers": 2})
    assert other.config_hash() != two.config_hash()  # the rest of task_options still is


@pytest.mark.parametrize(
    ("sections", "field", "fragment"),
    [
        ({"trainig": {}}, "trainig", "did you mean 'training'"),
        ({"training": {"lerning_rate": 1e-3}}, "training.lerning_rate", "did you mean"),
        ({"training": {"per_device_batch_size": -2}}, "training.per_device_batch_size", "got -2"),
        ({"training": {"precision": "fp8"}}, "training.precision", "expected one of"),
        (
            {"strategy": {"name": "dpp"}},
            "strategy.name",
            "unknown strategy 'dpp' (did you mean 'ddp'?)",
        ),
        ({"strategy": {"zero_stage": 4}}, "strategy.zero_stage", "1, 2 or 3"),
        ({"strategy": {"block_classes": 3}}, "strategy.block_classes", "list of class"),
        ({"checkpoint": {"evry": 3}}, "checkpoint.evry", "did you mean 'checkpoint.every'"),
        ({"run": {"log_every": 0}}, "run.log_every", ">= 1"),
        ({"task": {"model": "nocolon"}}, "task.model", "import string"),
        ({"task": {"model": "a:b"}}, "task.data", "both model and data"),
    ],
)
def test_bad_fields_are_one_line_naming_section_and_field(
    sections: dict[str, object], field: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _job(**sections)
    message = str(info.value)
    assert message.startswith("job.yaml: ") and "\n" not in message
    assert fragment in message
    assert info.value.field == field
    assert field in message or field == "strategy.name"  # "unknown strategy 'dpp'" names it


def test_load_job_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "task: charlm\ntraining:\n  global_batch_size: 32\n  per_device_batch_size: 8\n"
        "  learning_rate: 1e-3\nstrategy:\n  name: ddp\n"
    )
    job = load_job(path, ["training.max_steps=7", "strategy.name=fsdp", "run.output_dir=out"])
    assert (job.training.max_steps, job.strategy.name, job.run.output_dir) == (7, "fsdp", "out")
    assert job.training.learning_rate == 1e-3
    with pytest.raises(ConfigError, match=r"\(with --set\): unknown field 'training.max_step'"):
        load_job(path, ["training.max_step=7"])
    with pytest.raises(ConfigError, match="'training' is not a section"):
        load_job(path, ["training=3", "training.max_steps=2"])


def test_a_bare_strategy_name_is_the_short_spelling_of_its_mapping(tmp_path: Path) -> None:
    """``strategy: fsdp`` as strategy/spec.py documents it (and people write it): the same job
    and config hash as ``{name: fsdp}``; --set adds options to it; a typo is still one line."""
    head = "training:\n  global_batch_size: 32\n  per_device_batch_size: 8\n"
    short, long = tmp_path / "short.yaml", tmp_path / "long.yaml"
    short.write_text(head + "strategy: fsdp\n")
    long.write_text(head + "strategy:\n  name: fsdp\n")
    assert load_job(short) == load_job(long)
    assert load_job(short).config_hash() == load_job(long).config_hash()
    job = load_job(short, ["strategy.activation_checkpointing=true"])
    assert (job.strategy.name, job.strategy.activation_checkpointing) == ("fsdp", True)
    assert JobConfig.from_dict({"strategy": "ddp"}).strategy.name == "ddp"
    short.write_text(head + "strategy: fdsp\n")
    with pytest.raises(ConfigError, match=r"short.yaml: unknown strategy 'fdsp' \(did you mean"):
        load_job(short)
    with pytest.raises(ConfigError, match="section 'strategy': expected a mapping, got 3"):
        JobConfig.from_dict({"strategy": 3})


def test_job_module_imports_no_torch() -> None:
    code = "import sys, gpu_training.job; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(SRC)})
