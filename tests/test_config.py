"""TrainingConfig: batch arithmetic, LR scaling, and validation that names the field."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from gpu_training.config import (
    ConfigError,
    TrainingConfig,
    accumulation_plan,
    gradient_accumulation_for_target,
    load_config,
    scale_lr,
)

SRC = Path(__file__).resolve().parents[1] / "src"


def test_guide_effective_batch_snippet_runs_as_written() -> None:
    accum = gradient_accumulation_for_target(
        target_effective_batch=512, per_device_batch_size=8, world_size=4
    )
    cfg = TrainingConfig(per_device_batch_size=8, gradient_accumulation_steps=accum, world_size=4)
    assert cfg.effective_batch_size >= 512
    text = cfg.describe(num_samples=1_000_000)
    assert "effective batch: 512 = 8 per device x 16 accumulation x 4 ranks" in text
    assert "optimizer steps per epoch: 1953" in text


@pytest.mark.parametrize(
    ("target", "per_device", "world", "accum", "actual"),
    [(512, 8, 4, 16, 512), (500, 8, 4, 16, 512), (1, 8, 4, 1, 32), (96, 32, 3, 1, 96)],
)
def test_accumulation_rounds_up_and_reports_actual_batch(
    target: int, per_device: int, world: int, accum: int, actual: int
) -> None:
    plan = accumulation_plan(target, per_device, world)
    assert (plan.gradient_accumulation_steps, plan.effective_batch_size) == (accum, actual)
    assert plan.effective_batch_size >= target
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gradient_accumulation_for_target(target, per_device, world) == accum
    if actual == target:
        assert not caught
    else:
        assert len(caught) == 1 and f"effective batch of {actual}" in str(caught[0].message)


def test_scale_lr_linear_and_sqrt() -> None:
    assert scale_lr(1e-3, 256, 2048) == pytest.approx(8e-3)
    assert scale_lr(1e-3, 256, 1024, "sqrt") == pytest.approx(2e-3)
    assert scale_lr(1e-3, 256, 1024, "none") == pytest.approx(1e-3)
    with pytest.raises(ConfigError, match="rule"):
        scale_lr(1e-3, 256, 1024, "cubic")


def test_describe_warns_when_effective_batch_moved_from_tuned_batch() -> None:
    # The guide's trap: tuned at 256 on one GPU, same per-device batch on 8 GPUs -> 2048.
    cfg = TrainingConfig(per_device_batch_size=256, world_size=8, base_batch_size=256)
    assert cfg.effective_batch_size == 2048
    assert cfg.scaled_learning_rate == pytest.approx(8 * cfg.learning_rate)
    text = cfg.describe()
    assert "WARNING: effective batch 2048 is 8x the tuned batch 256" in text
    same = TrainingConfig(per_device_batch_size=32, world_size=8, base_batch_size=256)
    assert "WARNING" not in same.describe()
    unscaled = TrainingConfig(world_size=2, base_batch_size=32, lr_scaling="none")
    assert "lr_scaling is 'none'" in unscaled.describe()


def test_total_steps_prefers_max_steps() -> None:
    cfg = TrainingConfig(per_device_batch_size=10, epochs=3)
    assert cfg.total_steps(105) == 30
    assert TrainingConfig(max_steps=7).total_steps(10**6) == 7


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [
        ({"per_device_batch_size": "8"}, "per_device_batch_size", "expected an integer >= 1"),
        ({"per_device_batch_size": -4}, "per_device_batch_size", "got -4"),
        ({"per_device_batch_size": True}, "per_device_batch_size", "(bool)"),
        ({"gradient_accumulation_steps": 2.5}, "gradient_accumulation_steps", "(float)"),
        ({"precision": "fp61"}, "precision", "did you mean 'fp16'"),
        ({"learning_rate": 0}, "learning_rate", "> 0.0"),
        ({"learning_rate": float("nan")}, "learning_rate", "finite"),
        ({"max_grad_norm": -1.0}, "max_grad_norm", "> 0.0"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio", "[0, 1]"),
        ({"warmup_steps": 10, "max_steps": 5}, "warmup_steps", "max_steps"),
        (
            {"per_device_batchsize": 8},
            "per_device_batchsize",
            "did you mean 'per_device_batch_size'",
        ),
    ],
)
def test_bad_values_name_the_field(data: dict[str, object], field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainingConfig.from_dict(data, source="job.yaml")
    message = str(info.value)
    assert message.startswith("job.yaml: ")
    assert f"'{field}'" in message and fragment in message
    assert "\n" not in message
    assert info.value.field == field


def test_round_trip_and_file_loading(tmp_path: Path) -> None:
    cfg = TrainingConfig(per_device_batch_size=16, world_size=2, precision="bf16", max_steps=9)
    assert TrainingConfig.from_dict(cfg.to_dict()) == cfg
    as_json = tmp_path / "c.json"
    as_json.write_text(json.dumps(cfg.to_dict()))
    assert load_config(as_json) == cfg
    as_yaml = tmp_path / "c.yaml"
    as_yaml.write_text("per_device_batch_size: 16\nworld_size: 2\nprecision: bf16\nmax_steps: 9\n")
    assert load_config(as_yaml) == cfg
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing but a comment\n")
    with pytest.raises(ConfigError, match=r"empty.yaml: the config file is empty"):
        load_config(empty)  # every field at its default is never what an empty file meant


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("bad.yaml", "per_device_batch_size: [1, 2\n", "not valid YAML"),
        ("bad.json", "{not json", "not valid JSON"),
        ("list.yaml", "- 1\n- 2\n", "expected a mapping"),
    ],
)
def test_bad_files_name_the_file(tmp_path: Path, name: str, text: str, fragment: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=fragment) as info:
        load_config(path)
    assert str(path) in str(info.value)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")


def test_config_module_imports_no_torch() -> None:
    code = "import sys, gpu_training.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(SRC)})


def test_global_batch_defines_the_job_on_any_world_size() -> None:
    cfg = TrainingConfig(global_batch_size=64, per_device_batch_size=8)
    for world, accum in ((1, 8), (2, 4), (4, 2), (8, 1)):
        scaled = cfg.for_world_size(world)
        assert (scaled.gradient_accumulation_steps, scaled.effective_batch_size) == (accum, 64)
        assert "WARNING" not in scaled.describe()
    assert TrainingConfig.from_dict(cfg.for_world_size(4).to_dict()) == cfg.for_world_size(4)
    # Without a global batch the per-rank recipe is kept and the batch grows with the ranks.
    recipe = TrainingConfig(per_device_batch_size=8, gradient_accumulation_steps=2)
    assert recipe.for_world_size(4).effective_batch_size == 64


def test_global_batch_that_does_not_split_names_numbers_and_fixes() -> None:
    cfg = TrainingConfig(global_batch_size=64, per_device_batch_size=8)
    with pytest.raises(ConfigError) as info:
        cfg.for_world_size(3)
    message = str(info.value)
    assert "global batch 64 does not split into 3 ranks × per-device batch 8" in message
    assert "use a global batch of 48" in message and info.value.field == "global_batch_size"
    with pytest.raises(ConfigError, match="contradicts global_batch_size 64"):
        TrainingConfig(global_batch_size=64, per_device_batch_size=8, gradient_accumulation_steps=3)
