"""Tests for ``gpu-training ckpt``: inspect, verify and consolidate checkpoint directories.

The checkpoints are real (sharded ones through DCP, a plain one through ``save``), damage is
real (a flipped byte, a truncated shard, a broken manifest), and outputs are loaded back into a
plain model and compared tensor by tensor.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from dist_harness import run_python
from gpu_training.checkpoint import CheckpointManager
from gpu_training.cli import build_parser, main
from gpu_training.commands import ckpt as ckpt_command
from gpu_training.ddp import DistributedContext

SINGLE = DistributedContext()
FIXTURES = Path(__file__).parent / "fixtures" / "legacy_checkpoints"


def _model(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A checkpoint root with sharded steps 1 and 2 (AdamW after one step, extra state)."""
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.ones(3, 6)).sum().backward()
    opt.step()
    ckpt = CheckpointManager(tmp_path / "ckpt", ctx=SINGLE, config_hash="abc123")
    for step in (1, 2):
        ckpt.save_sharded(model, opt, step, extra={"step": step})
    torch.save(model.state_dict(), tmp_path / "expected.pt")
    return tmp_path / "ckpt"


def _expected(root: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(root.parent / "expected.pt", weights_only=True)
    return state


def _assert_one_error_line(err: str, *needles: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{err}"
    assert lines[0].startswith("gpu-training: error: ckpt"), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def _flip_byte(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0xFF
    file.write_bytes(bytes(data))


def _listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# --- surface and import cost --------------------------------------------------------------------


def test_ckpt_actions_are_registered() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "ckpt" in sub.choices
    ckpt = sub.choices["ckpt"]
    actions = next(a for a in ckpt._actions if isinstance(a, argparse._SubParsersAction))
    assert set(actions.choices) == {"inspect", "verify", "consolidate", "export-hf"}
    assert callable(ckpt_command.register)


@pytest.mark.parametrize("argv", [["ckpt", "--help"], ["ckpt", "consolidate", "--help"]])
def test_ckpt_help_does_not_import_torch(argv: list[str]) -> None:
    proc = run_python(["-X", "importtime", "-m", "gpu_training", *argv], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "usage: gpu-training ckpt" in proc.stdout
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "gpu_training.cli" in modules  # the probe works
    assert not sorted(m for m in modules if m == "torch" or m.startswith("torch."))


# --- inspect ------------------------------------------------------------------------------------


def test_inspect_root_shows_newest_step(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ckpt", "inspect", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint   {root / 'step-00000002'}" in out
    assert "step         2\n" in out
    assert "format       dcp (sharded" in out
    assert "world size   1\n" in out
    assert "config hash  abc123\n" in out
    for name in (".metadata", "__0_0.distcp", "extra.pt"):
        size = (root / "step-00000002" / name).stat().st_size
        assert any(line.split()[:1] == [name] for line in out.splitlines()), name
        assert size > 0


def test_inspect_step_dir_and_json(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ckpt", "inspect", str(root / "step-00000001"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["path"] == str(root / "step-00000001")
    manifest = doc["manifest"]
    assert manifest["step"] == 1 and manifest["state_format"] == "dcp"
    sizes = {f["name"]: f["size"] for f in manifest["files"]}
    assert sizes == {
        name: (root / "step-00000001" / name).stat().st_size
        for name in (".metadata", "__0_0.distcp", "extra.pt")
    }


def test_inspect_plain_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    CheckpointManager(tmp_path, ctx=SINGLE).save({"model_state": _model(0).state_dict()}, step=5)
    assert main(["ckpt", "inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "format       torch\n" in out and "state.pt" in out
    assert "layout" not in out  # a hand-written loop recorded no training settings


def _inspect(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main(["ckpt", "inspect", str(path), *flags]) == 0
    return capsys.readouterr().out


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_inspect_shows_the_layout_that_ran_and_it_resumes_on_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job of global batch 8, 4 per device, run on 2 ranks: the manifest records 2 x 4 x 1
    (not the 1 x 4 x 2 the job file resolves to alone) under the same config hash, and the
    checkpoint resumes on 1 rank without a word about changed settings."""
    from gpu_training.job import load_job
    from train_jobs import train

    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "task": "charlm",
                "task_options": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
                "training": {"global_batch_size": 8, "per_device_batch_size": 4, "max_steps": 4},
                "strategy": {"name": "ddp"},
                "checkpoint": {"every": 2, "keep_last_n": 5},
                "run": {"output_dir": str(tmp_path / "run"), "plot": False, "progress": False},
            }
        )
    )
    train(job, 2)
    root = tmp_path / "run" / "checkpoints"
    out = _inspect(root, capsys)
    assert "world size   2\n" in out
    assert "layout       2 ranks x 4 per device x 1 accumulation = global batch 8\n" in out
    manifest = json.loads(_inspect(root, capsys, "--json"))["manifest"]
    training = manifest["config"]["training"]
    assert (training["world_size"], training["gradient_accumulation_steps"]) == (2, 1)
    assert (training["per_device_batch_size"], training["global_batch_size"]) == (4, 8)
    assert manifest["config_hash"] == load_job(job).config_hash()

    shutil.rmtree(root / "step-00000004")  # stopped after step 2
    resumed = train(job, 1)
    assert "resumed from" in resumed and "warning" not in resumed, resumed
    out = _inspect(root, capsys)
    assert "layout       1 rank x 4 per device x 2 accumulation = global batch 8\n" in out


def test_inspect_derives_the_layout_of_a_manifest_from_before_it_was_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Old manifests recorded the job as written (world size 1 and its accumulation): the
    layout comes from their global batch and world size, as the run derived it."""
    shutil.copytree(FIXTURES / "none" / "step-00000002", tmp_path / "step-00000002")
    out = _inspect(tmp_path, capsys)  # a real one: global batch 4, 2 per device, 1 rank
    assert "layout       1 rank x 2 per device x 2 accumulation = global batch 4\n" in out
    manifest_file = tmp_path / "step-00000002" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["world_size"] = 2  # as a 2-rank run of that job wrote it
    manifest_file.write_text(json.dumps(manifest))
    out = _inspect(tmp_path, capsys)
    assert "layout       2 ranks x 2 per device x 1 accumulation = global batch 4\n" in out


# --- verify -------------------------------------------------------------------------------------


def test_verify_intact(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ckpt", "verify", str(root)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "step-00000001  OK",
        "step-00000002  OK",
        "2 checked: 2 OK, 0 corrupt",
    ]


def test_verify_detects_a_corrupted_shard(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = root / "step-00000002" / "__0_0.distcp"
    _flip_byte(shard, shard.stat().st_size // 2)  # same size: only the checksum can tell
    assert main(["ckpt", "verify", str(root)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "step-00000001  OK"
    assert lines[1] == "step-00000002  CORRUPT"
    assert "__0_0.distcp: checksum mismatch" in lines[2]
    assert lines[-1] == "2 checked: 1 OK, 1 corrupt"
    # the given step only
    assert main(["ckpt", "verify", str(root / "step-00000001")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 checked: 1 OK, 0 corrupt"


def test_verify_truncated_file_in_a_subprocess(root: Path) -> None:
    shard = root / "step-00000001" / "__0_0.distcp"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 10)
    proc = run_python(["-m", "gpu_training", "ckpt", "verify", str(root)], timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "step-00000001  CORRUPT" in proc.stdout and "truncated" in proc.stdout
    assert "step-00000002  OK" in proc.stdout
    assert proc.stderr == ""


# --- consolidate --------------------------------------------------------------------------------


def test_consolidate_safetensors_and_pt(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file

    out_dir = root.parent
    assert main(["ckpt", "consolidate", str(root), str(out_dir / "m.safetensors")]) == 0
    assert f"from {root / 'step-00000002'}" in capsys.readouterr().out
    assert main(["ckpt", "consolidate", str(root), str(out_dir / "m.pt")]) == 0
    argv = ["ckpt", "consolidate", str(root), str(out_dir / "all.pt"), "--include-optimizer"]
    assert main(argv) == 0
    expected = _expected(root)
    for weights in (
        load_file(out_dir / "m.safetensors"),
        torch.load(out_dir / "m.pt", weights_only=True),
        torch.load(out_dir / "all.pt", weights_only=True)["model_state"],
    ):
        model = _model(99)
        model.load_state_dict(weights)
        for key, value in expected.items():
            assert torch.equal(model.state_dict()[key], value), key
    bundle = torch.load(out_dir / "all.pt", weights_only=True)
    assert bundle["extra"] == {"step": 2}
    assert set(bundle["optimizer_state"]["state"]) == set(expected)  # keyed by parameter name


def test_consolidate_force_replaces(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = root.parent / "m.pt"
    out.write_bytes(b"old")
    assert main(["ckpt", "consolidate", str(root), str(out)]) == 2
    _assert_one_error_line(capsys.readouterr().err, "exists", "--force")
    assert out.read_bytes() == b"old"
    assert main(["ckpt", "consolidate", str(root), str(out), "--force"]) == 0
    assert set(torch.load(out, weights_only=True)) == set(_expected(root))


# --- bad input: one line, exit 2, nothing written -----------------------------------------------


def _bad_cases(root: Path) -> list[tuple[list[str], list[str]]]:
    empty = root.parent / "empty"
    empty.mkdir()
    out = root.parent / "out"
    return [
        (["inspect", str(root.parent / "missing")], ["no such checkpoint directory"]),
        (["verify", str(root.parent / "missing")], ["no such checkpoint directory"]),
        (["inspect", str(empty)], ["no checkpoint"]),
        (["verify", str(empty)], ["no checkpoint"]),
        (["consolidate", str(empty), str(out / "m.pt")], ["no checkpoint"]),
        (["consolidate", str(root), str(root.parent / "m.bin")], ["unknown output type", ".bin"]),
        (["consolidate", str(root), str(root.parent / "m")], ["unknown output type"]),
        (["consolidate", str(root), str(out / "m.pt")], ["not a writable directory"]),
        (
            ["consolidate", str(root), str(root.parent / "m.safetensors"), "--include-optimizer"],
            ["weights only"],
        ),
        (
            ["export-hf", str(root), str(root.parent / "adapter"), "--adapter", "--base-name", ""],
            ["--base-name", "empty"],
        ),
        (
            ["export-hf", str(root), str(root.parent / "merged"), "--base-name", "org/model"],
            ["--base-name", "needs --adapter"],
        ),
        (["inspect"], ["DIR"]),
        (["consolidate", str(root)], ["OUT"]),
        (["bogus", str(root)], ["invalid choice"]),
    ]


def test_bad_inputs_are_one_line_exit_2(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = _bad_cases(root)
    before = _listing(root.parent)
    for argv, needles in cases:
        assert main(["ckpt", *argv]) == 2, argv
        captured = capsys.readouterr()
        assert captured.out == "", argv
        _assert_one_error_line(captured.err, *needles)
    assert _listing(root.parent) == before


def test_damaged_checkpoint_is_bad_input(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    step = root / "step-00000002"
    (step / "manifest.json").write_text("{not json")
    _flip_byte(root / "step-00000001" / "__0_0.distcp", 200)
    before = _listing(root.parent)
    # inspect of the broken step itself, consolidate of the corrupted older one
    assert main(["ckpt", "inspect", str(step)]) == 2
    _assert_one_error_line(capsys.readouterr().err, "manifest.json", "unreadable")
    argv = ["ckpt", "consolidate", str(root / "step-00000001"), str(root.parent / "m.pt")]
    assert main(argv) == 2
    _assert_one_error_line(capsys.readouterr().err, "checksum mismatch")
    # inspect checks the manifest and sizes, not checksums: the root's newest is step 1 now
    assert main(["ckpt", "inspect", str(root)]) == 0
    assert "step         1\n" in capsys.readouterr().out
    (root / "step-00000001" / "extra.pt").unlink()
    assert main(["ckpt", "inspect", str(root)]) == 2
    _assert_one_error_line(capsys.readouterr().err, "none of its 2 step directories")
    before = _listing(root.parent)
    assert main(["ckpt", "verify", str(root)]) == 1
    assert "2 checked: 0 OK, 2 corrupt" in capsys.readouterr().out
    assert _listing(root.parent) == before


def test_unwritable_output_directory(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    locked = root.parent / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["ckpt", "consolidate", str(root), str(locked / "m.pt")]) == 2
        _assert_one_error_line(capsys.readouterr().err, "not a writable directory")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)
