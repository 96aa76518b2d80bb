"""The trust boundary: checkpoints are data, whoever wrote them and whatever their manifest says.

Third-party readers (DeepSpeed, DCP) unpickle with ``weights_only=False``; here they run with
every load forced to ``weights_only`` and an allow-list. Paths never leave a checkpoint.
A pickle payload is a class whose ``__reduce__`` calls ``os.system``: it touches a marker
file if it ever runs.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dist_harness import REPO_ROOT
from gpu_training.checkpoint import (
    CheckpointError,
    CheckpointManager,
    consolidate,
    find_resumable,
    verify_checkpoints,
)
from gpu_training.checkpoint.collective import save_directory
from gpu_training.checkpoint.files import file_checksum
from gpu_training.checkpoint.formats import DEEPSPEED
from gpu_training.checkpoint.safe_load import check_pickles, refused_message, weights_only_loads
from gpu_training.ddp import DistributedContext
from train_jobs import train


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _evil_file(path: Path, marker: Path) -> Path:
    torch.save({"weights": torch.ones(2), "x": _Payload(marker)}, path)
    return path


def _relist(step_dir: Path, name: str) -> None:
    """Makes the manifest vouch for ``name`` as it is now (an attacker writes manifests too)."""
    manifest = json.loads((step_dir / "manifest.json").read_text())
    file = step_dir / name
    entry = {"name": name, "size": file.stat().st_size, "checksum": file_checksum(file)}
    manifest["files"] = [e for e in manifest["files"] if e["name"] != name] + [entry]
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


def test_forced_weights_only_overrides_an_explicit_false(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = _evil_file(tmp_path / "evil.pt", marker)
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # a user's setting must not win
    with weights_only_loads():
        with weights_only_loads():  # re-entrant
            pass
        assert os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] == "1"
        with pytest.raises(pickle.UnpicklingError) as info:
            torch.load(evil, weights_only=False)  # what DeepSpeed and DCP call
    assert not marker.exists(), "the payload ran"
    assert "posix.system" in (refused_message(evil, info.value) or "")
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
    assert os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1", "the environment comes back"


def test_forcing_holds_while_another_thread_leaves_its_own_block(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = _evil_file(tmp_path / "evil.pt", marker)
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with weights_only_loads():
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    entered.wait(10)
    with weights_only_loads():
        leave.set()
        thread.join(10)  # the other block ended: ours is still in force
        with pytest.raises(pickle.UnpicklingError):
            torch.load(evil, weights_only=False)
    assert not marker.exists()


def test_check_pickles_names_the_file_and_the_global(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(3), "step": 4}, good)
    check_pickles([good])
    evil = _evil_file(tmp_path / "evil.pt", tmp_path / "ran")
    with pytest.raises(CheckpointError) as info:
        check_pickles([good, evil])
    message = str(info.value)
    assert f"refused to read {evil}" in message and "posix.system" in message
    assert "--trust-checkpoint" in message and "nothing from it was executed" in message
    (tmp_path / "junk.pt").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match=r"could not read .*junk.pt"):
        check_pickles([tmp_path / "junk.pt"])
    assert not (tmp_path / "ran").exists()


def _plain_checkpoint(root: Path, steps: tuple[int, ...] = (2,)) -> CheckpointManager:
    ckpt = CheckpointManager(root, ctx=DistributedContext(), keep_last_n=None)
    for step in steps:
        ckpt.save({"model_state": {"w": torch.full((4,), float(step))}, "step": step}, step=step)
    return ckpt


def test_a_symlinked_state_file_is_never_followed(tmp_path: Path) -> None:
    ckpt = _plain_checkpoint(tmp_path / "ck")
    step_dir = tmp_path / "ck" / "step-00000002"
    secret = tmp_path / "secret.pt"
    shutil.copy(step_dir / "state.pt", secret)  # same bytes: size and checksum would pass
    (step_dir / "state.pt").unlink()
    (step_dir / "state.pt").symlink_to(secret)
    problems = verify_checkpoints(step_dir)[step_dir]
    assert problems and "symbolic link" in problems[0] and "not followed" in problems[0]
    with pytest.raises(CheckpointError, match="symbolic link"):
        ckpt.load(step_dir)
    out = tmp_path / "out.pt"
    with pytest.raises(CheckpointError, match="symbolic link"):
        consolidate(step_dir, out)
    assert not out.exists()
    assert find_resumable(tmp_path / "ck").latest is None


def test_a_symlinked_manifest_is_refused(tmp_path: Path) -> None:
    _plain_checkpoint(tmp_path / "ck")
    step_dir = tmp_path / "ck" / "step-00000002"
    elsewhere = tmp_path / "manifest.json"
    shutil.move(step_dir / "manifest.json", elsewhere)
    (step_dir / "manifest.json").symlink_to(elsewhere)
    assert "symbolic link" in verify_checkpoints(step_dir)[step_dir][0]


def test_a_file_the_manifest_does_not_list_fails_a_multi_file_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ck", ctx=DistributedContext())

    def write(tmp: Path) -> set[str]:
        torch.save({"w": torch.ones(1)}, tmp / "mp_rank_00_model_states.pt")
        return {"mp_rank_00_model_states.pt"}

    step_dir = save_directory(manager.store, manager.ctx, 3, write, DEEPSPEED, extra={"step": 3})
    assert step_dir is not None and verify_checkpoints(step_dir)[step_dir] == []
    # DeepSpeed's readers glob *_optim_states.pt: a planted file would be read unverified
    _evil_file(step_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt", tmp_path / "ran")
    problems = verify_checkpoints(step_dir)[step_dir]
    assert len(problems) == 1 and "not listed in the manifest" in problems[0]
    assert find_resumable(tmp_path / "ck").latest is None


def test_consolidate_never_writes_into_the_checkpoint_it_reads(tmp_path: Path) -> None:
    _plain_checkpoint(tmp_path / "ck", steps=(2, 4))
    root = tmp_path / "ck"
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for out in (root / "step-00000004" / "state.pt", root / "step-00000002" / "w.pt"):
        with pytest.raises(CheckpointError, match="inside the checkpoint"):
            consolidate(root, out, overwrite=True)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert consolidate(root, root / "model.pt").is_file()  # beside the step dirs is fine


# --- DeepSpeed, for real ------------------------------------------------------------------------

needs_deepspeed = pytest.mark.skipif(find_spec("deepspeed") is None, reason="needs deepspeed")
_TINY_JOB = {
    "task": "charlm",
    "task_options": {"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32},
    "training": {
        "global_batch_size": 16,
        "per_device_batch_size": 8,
        "max_steps": 2,
        "precision": "fp32",
        "learning_rate": 3e-3,
    },
    "strategy": {"name": "deepspeed", "zero_stage": 2},
    "checkpoint": {"every": 2},
    "run": {"plot": False, "tensorboard": False, "eval_batches": 1, "progress": False},
}


@pytest.fixture(scope="module")
def zero2_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if find_spec("deepspeed") is None:
        pytest.skip("needs deepspeed")
    root = tmp_path_factory.mktemp("zero2")
    job = {**_TINY_JOB, "run": {**_TINY_JOB["run"], "output_dir": str(root / "run")}}
    (root / "job.yaml").write_text(yaml.safe_dump(job))
    train(root / "job.yaml", 2, timeout=200)
    return root / "run" / "checkpoints" / "step-00000002"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_training", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_deepspeed
def test_deepspeed_payload_is_refused_and_trust_is_explicit(
    zero2_checkpoint: Path, tmp_path: Path
) -> None:
    """The measured defect: a payload in *_optim_states.pt ran under ckpt consolidate."""
    root = tmp_path / "ck"
    shutil.copytree(zero2_checkpoint.parent, root, ignore=shutil.ignore_patterns("*.py"))
    step_dir = root / zero2_checkpoint.name
    optim = sorted(step_dir.glob("*_optim_states.pt"))[0]
    marker = tmp_path / "ran"
    state = torch.load(optim, weights_only=False)  # our own file, to alter like an attacker
    torch.save({**state, "payload": _Payload(marker)}, optim)
    _relist(step_dir, optim.name)
    proc = _cli("ckpt", "consolidate", str(step_dir), str(tmp_path / "w.safetensors"))
    assert proc.returncode == 2, proc.stderr
    assert not marker.exists(), "the payload ran"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gpu-training:")]
    assert len(lines) == 1 and optim.name in lines[0] and "posix.system" in lines[0]
    assert "Traceback" not in proc.stderr and not (tmp_path / "w.safetensors").exists()

    # A harmless class DeepSpeed's allow-list does not know: refused without trust, read with.
    torch.save({**state, "note": argparse.Namespace(why="a newer DeepSpeed")}, optim)
    _relist(step_dir, optim.name)
    refused = _cli("ckpt", "consolidate", str(step_dir), str(tmp_path / "w.safetensors"))
    assert refused.returncode == 2 and "argparse.Namespace" in refused.stderr
    trusted = _cli(
        "ckpt", "consolidate", str(step_dir), str(tmp_path / "w.safetensors"), "--trust-checkpoint"
    )
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    assert (tmp_path / "w.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_deepspeed
def test_reading_a_zero_checkpoint_per_parameter_unpickles_no_payload(
    zero2_checkpoint: Path, tmp_path: Path
) -> None:
    """Resharding's own reader of DeepSpeed's files (a ZeRO checkpoint resumed under another
    layout): the same allow-list, the refusal names the file, nothing runs; trust is explicit."""
    step_dir = tmp_path / zero2_checkpoint.name
    shutil.copytree(zero2_checkpoint, step_dir)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert DEEPSPEED.param_source(step_dir, manifest, order=[]).names  # intact: it reads
    optim = sorted(step_dir.glob("*_optim_states.pt"))[-1]
    marker = tmp_path / "ran"
    state = torch.load(optim, weights_only=False)  # our own file, to alter like an attacker
    torch.save({**state, "payload": _Payload(marker)}, optim)
    with pytest.raises(CheckpointError) as info:
        DEEPSPEED.param_source(step_dir, manifest, order=[])
    assert not marker.exists(), "the payload ran"
    assert optim.name in str(info.value) and "posix.system" in str(info.value)

    torch.save({**state, "note": argparse.Namespace(why="a newer DeepSpeed")}, optim)
    with pytest.raises(CheckpointError, match=r"argparse\.Namespace"):
        DEEPSPEED.param_source(step_dir, manifest, order=[])
    assert DEEPSPEED.param_source(step_dir, manifest, order=[], trusted=True).names


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_deepspeed
def test_a_poisoned_zero_checkpoint_is_refused_before_another_strategy_resumes_it(
    zero2_checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    shutil.copytree(zero2_checkpoint.parent.parent, out)
    step_dir = out / "checkpoints" / zero2_checkpoint.name
    optim = sorted(step_dir.glob("*_optim_states.pt"))[0]
    marker = tmp_path / "ran"
    state = torch.load(optim, weights_only=False)
    torch.save({**state, "payload": _Payload(marker)}, optim)
    _relist(step_dir, optim.name)
    job = {
        **_TINY_JOB,
        "strategy": {"name": "ddp"},
        "run": {**_TINY_JOB["run"], "output_dir": str(out)},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    before = sorted(p.name for p in out.rglob("*"))
    proc = _cli("train", str(tmp_path / "job.yaml"), "--nproc", "2")
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    assert not marker.exists(), "the payload ran"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gpu-training:")]
    assert len(lines) == 1 and optim.name in lines[0] and "posix.system" in lines[0]
    assert sorted(p.name for p in out.rglob("*")) == before, "nothing may be written"
