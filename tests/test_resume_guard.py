"""What stands between a run and its checkpoints: nothing damaged is skipped or overwritten,
changed settings are named, the metrics file shows every step once, and ``train`` checks it
all before any process starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dist_harness import REPO_ROOT
from gpu_training.checkpoint import find_resumable
from gpu_training.config import ConfigError
from gpu_training.job import JobConfig
from gpu_training.preflight import check_launch, check_writable
from gpu_training.reporting import MetricsWriter, read_metrics
from gpu_training.resume import ResumeError, check_resumable, layout_change
from gpu_training.trainer import Trainer
from train_jobs import train

pytestmark = pytest.mark.timeout(120)


def _job(
    out: Path, *, sections: dict[str, dict[str, Any]] | None = None, **training: Any
) -> JobConfig:
    data = _job_dict(out, **training)
    for name, values in (sections or {}).items():
        data[name] = {**data[name], **values}
    return JobConfig.from_dict(data)


def _job_dict(out: Path, **training: Any) -> dict[str, Any]:
    return dict(
        {
            "task": "charlm",
            "task_options": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
            "training": {
                "global_batch_size": 8,
                "per_device_batch_size": 4,
                "max_steps": 4,
                "learning_rate": 3e-3,
                "precision": "fp32",
                **training,
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
                "tensorboard": False,
            },
        }
    )


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    Trainer(_job(out), quiet=True).fit()
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def test_every_damaged_checkpoint_refuses_instead_of_starting_over(
    finished_run: Path, tmp_path: Path
) -> None:
    out = _copy(finished_run, tmp_path)
    ckpts = out / "checkpoints"
    for state in ckpts.glob("step-*/state.pt"):
        with open(state, "r+b") as f:
            f.truncate(100)
    before = _files(ckpts)
    with pytest.raises(ResumeError) as info:
        Trainer(_job(out), quiet=True).fit()
    message = str(info.value)
    assert "2 damaged checkpoint(s)" in message and "step-00000004" in message
    assert "truncated" in message and f"mkdir -p {ckpts / 'damaged'}" in message
    assert "it then starts at step 0" in message
    assert _files(ckpts) == before, "nothing may be overwritten"
    with pytest.raises(ResumeError, match="damaged"):
        check_launch(_job(out), 1)  # the same refusal before any process starts


def test_a_corrupt_newest_checkpoint_is_named_not_skipped(
    finished_run: Path, tmp_path: Path
) -> None:
    out = _copy(finished_run, tmp_path)
    state = out / "checkpoints" / "step-00000004" / "state.pt"
    data = bytearray(state.read_bytes())
    data[-200] ^= 0xFF  # same size: only the checksum sees it
    state.write_bytes(bytes(data))
    assert find_resumable(out / "checkpoints").latest == state.parent  # sizes look fine
    with pytest.raises(ResumeError) as info:
        Trainer(_job(out, max_steps=6), quiet=True, allow_config_change=True).fit()
    assert "checksum mismatch" in str(info.value)
    assert "it then resumes from step-00000002" in str(info.value)
    assert state.read_bytes() == bytes(data)


def test_changed_math_is_named_and_needs_allow_config_change(
    finished_run: Path, tmp_path: Path
) -> None:
    out = _copy(finished_run, tmp_path)
    changed = _job(out, learning_rate=1e-2, max_steps=6)
    with pytest.raises(ResumeError) as info:
        Trainer(changed, quiet=True).fit()
    message = str(info.value)
    assert "training.learning_rate: 0.003 -> 0.01" in message
    assert "training.max_steps: 4 -> 6" in message and "--allow-config-change" in message
    with pytest.raises(ResumeError, match="learning_rate"):
        check_launch(changed, 1)
    summary = Trainer(changed, quiet=True, allow_config_change=True).fit()
    assert summary["step"] == 6


def test_settings_that_do_not_change_the_math_only_warn(finished_run: Path) -> None:
    out = finished_run  # read only
    step_dir = out / "checkpoints" / "step-00000004"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    # another split of the same global batch, another logging cadence: the same math
    job = _job(out, per_device_batch_size=2, sections={"run": {"log_every": 2}})
    warnings = check_resumable(job, step_dir, manifest)
    assert warnings == [
        f"{step_dir.name} was written with run.log_every: 1 -> 2 (does not change the math)"
    ]


def test_a_format_the_strategy_cannot_load_is_refused(finished_run: Path) -> None:
    step_dir = finished_run / "checkpoints" / "step-00000004"
    manifest = {**json.loads((step_dir / "manifest.json").read_text()), "state_format": "pickle"}
    job = _job(finished_run, sections={"strategy": {"name": "deepspeed"}})
    with pytest.raises(
        ResumeError, match="pickle checkpoint and strategy 'deepspeed' resumes Deep"
    ):
        check_resumable(job, step_dir, manifest)


def test_the_strategys_layout_is_not_the_math(finished_run: Path) -> None:
    """none, DDP, FSDP2 and ZeRO-1/2/3 compute the same steps: another strategy, sharding,
    activation checkpointing, ZeRO stage or offload resumes without --allow-config-change and
    without a warning; the layout change is said once, by the resume line. What a DeepSpeed
    file says beyond the layout (its own optimizer, say) is still compared, by its content."""
    step_dir = finished_run / "checkpoints" / "step-00000004"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    layout = {"name": "fsdp", "activation_checkpointing": True, "reshard_after_forward": False}
    job = _job(finished_run, sections={"strategy": layout})
    assert check_resumable(job, step_dir, manifest) == []
    assert job.config_hash() == _job(finished_run).config_hash()
    assert layout_change(job, manifest, 2) == (
        "written by a plain model on 1 rank under FSDP on 2: optimizer state resharded"
    )
    assert layout_change(_job(finished_run), manifest, 1) is None
    ddp = _job(finished_run, sections={"strategy": {"name": "ddp"}})
    assert layout_change(ddp, manifest, 2) == "written by a plain model on 1 rank under DDP on 2"
    zero = {"name": "deepspeed", "zero_stage": 3, "offload": "optimizer"}
    assert (
        check_resumable(_job(finished_run, sections={"strategy": zero}), step_dir, manifest) == []
    )
    zero2 = {"name": "deepspeed", "zero_stage": 2}
    written = {**manifest, "world_size": 2, "config": {"strategy": zero2}}
    assert layout_change(_job(finished_run, sections={"strategy": zero}), written, 2) == (
        "written by ZeRO-2 on 2 ranks under ZeRO-3 with CPU offload on 2: optimizer state resharded"
    )
    offloaded = _job(finished_run, sections={"strategy": {**zero2, "offload": "optimizer"}})
    assert layout_change(offloaded, written, 2) == (  # the offload alone: another layout too
        "written by ZeRO-2 on 2 ranks under ZeRO-2 with CPU offload on 2: optimizer state resharded"
    )
    assert layout_change(_job(finished_run, sections={"strategy": zero2}), written, 2) is None
    layout_only = finished_run.parent / "zero.json"
    layout_only.write_text(
        json.dumps({"zero_optimization": {"stage": 1}, "fp16": {"enabled": "auto"}})
    )
    zero_file = {**zero, "deepspeed_config": str(layout_only)}
    assert (
        check_resumable(_job(finished_run, sections={"strategy": zero_file}), step_dir, manifest)
        == []
    )
    own = finished_run.parent / "own_optimizer.json"
    own.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"betas": [0.8, 0.9]}}}))
    own_optimizer = _job(
        finished_run, sections={"strategy": {**zero, "deepspeed_config": str(own)}}
    )
    with pytest.raises(
        ResumeError, match=r'strategy.deepspeed.optimizer.type: \(unset\) -> "AdamW"'
    ):
        check_resumable(own_optimizer, step_dir, manifest)
    ignored = _job(
        finished_run, sections={"strategy": {"name": "fsdp", "deepspeed_config": str(own)}}
    )
    assert check_resumable(ignored, step_dir, manifest) == []  # FSDP reads no DeepSpeed file


LEGACY = REPO_ROOT / "tests" / "fixtures" / "legacy_checkpoints"


@pytest.mark.parametrize("strategy", ["none", "fsdp", "deepspeed"])
def test_a_manifest_recording_only_a_hash_still_resumes(strategy: str) -> None:
    """Manifests hashed the strategy's layout with the math until it left the math settings,
    then DeepSpeed's stage, offload and config path until they did too: a manifest that
    records only a hash is compared with every definition."""
    source = LEGACY / strategy
    job = JobConfig.from_dict(yaml.safe_load((source / "job.yaml").read_text()))
    step_dir = source / "step-00000002"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert manifest["config_hash"] == job.config_hashes()[1] != job.config_hash()
    hash_only = {k: v for k, v in manifest.items() if k != "config"}
    assert check_resumable(job, step_dir, hash_only) == []
    # while DeepSpeed's stage, offload and config path counted, before issue 31's slice 2b
    between = {**hash_only, "config_hash": job.config_hashes()[2]}
    assert check_resumable(job, step_dir, between) == []
    other = JobConfig.from_dict({**job.to_dict(), "task_options": {"n_embd": 64}})
    with pytest.raises(ResumeError, match="fields unknown: the manifest records only a hash"):
        check_resumable(other, step_dir, hash_only)


def test_a_stepper_state_without_a_loss_scale_resumes_under_another_strategy() -> None:
    """FSDP2 computes bf16 through its policy (its stepper runs fp32), DDP through autocast
    (its stepper says bf16): with no loss scale to carry, either resumes the other. An fp16
    scale still refuses a run without one."""
    from gpu_training.amp import MixedPrecisionStepper
    from gpu_training.ddp import DistributedContext
    from gpu_training.resume import capture_run_state, restore_run_state

    ctx = DistributedContext()
    model = torch.nn.Linear(2, 1)
    ddp_bf16 = MixedPrecisionStepper(torch.optim.AdamW(model.parameters()), "bf16", 1)
    fsdp_bf16 = MixedPrecisionStepper(torch.optim.AdamW(model.parameters()), "fp32", 1)
    ddp_bf16.skipped_steps = 2
    saved = capture_run_state(ctx, step=5, amp=ddp_bf16)
    assert restore_run_state(saved, ctx, amp=fsdp_bf16) == 5 and fsdp_bf16.skipped_steps == 2
    scaled = {
        **saved,
        "amp_state": {
            **saved["amp_state"],
            "precision": "fp16",
            "scaler": {"scale": 1024.0, "_growth_tracker": 0},
        },
    }
    with pytest.raises(ValueError, match="saved with precision 'fp16'"):
        restore_run_state(scaled, ctx, amp=fsdp_bf16)


def test_a_model_of_another_shape_is_named_before_launch(finished_run: Path) -> None:
    job = _job(finished_run, sections={"task_options": {"n_embd": 32}})
    with pytest.raises(ResumeError) as info:
        check_launch(job, 1, allow_config_change=True)
    assert "another shape: 'wte.weight' is [72, 16] there and [72, 32] in this job" in str(
        info.value
    )


def test_metrics_show_every_step_once_after_a_crash(finished_run: Path, tmp_path: Path) -> None:
    out = _copy(finished_run, tmp_path)
    import shutil

    # A crash after step 4 was logged but before its checkpoint: the run redoes 3 and 4.
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    Trainer(_job(out), quiet=True).fit()
    records = read_metrics(out / "metrics.jsonl")
    train_steps = [r["step"] for r in records if r["split"] == "train"]
    assert train_steps == [1, 2, 3, 4]
    assert [r["step"] for r in records if r["split"] == "val"] == [2, 4]


def test_metrics_writer_cuts_back_to_the_resumed_step(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        for step in range(1, 7):
            writer.write("train", step, {"loss": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"split": "tr')  # a line torn by a kill
    with MetricsWriter(tmp_path, tensorboard=False, resume_step=3) as writer:
        writer.write("train", 4, {"loss": 40.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]


def test_check_writable_names_a_file_in_the_way_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match=r"'checkpoint.dir': .*afile/ck is under a file"):
        check_writable(tmp_path / "afile" / "ck", "checkpoint.dir")
    with pytest.raises(ConfigError, match="is a file"):
        check_writable(tmp_path / "afile", "run.output_dir")
    check_writable(tmp_path / "new" / "deeper", "run.output_dir")
    check_writable(tmp_path, "run.output_dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_check_writable_names_a_read_only_mount(tmp_path: Path) -> None:
    mnt = tmp_path / "ro"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mnt)])
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(ConfigError, match=r"'checkpoint.dir': cannot write in .*read-only"):
            check_writable(mnt / "ck", "checkpoint.dir")
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_train_refuses_an_empty_job_file_and_config_check_reads_job_files(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_training", "train", str(tmp_path / "empty.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "the job file is empty" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()
    for config in sorted((REPO_ROOT / "configs").glob("*.yaml")):
        check = subprocess.run(
            [sys.executable, "-m", "gpu_training", "config", "check", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stderr
        assert "effective batch: 32" in check.stdout and "strategy:" in check.stdout
    assert yaml.safe_load((REPO_ROOT / "configs" / "ddp_config.yaml").read_text())["task"]


def test_resumed_weights_match_the_recorded_settings(finished_run: Path) -> None:
    """The manifest records the job it was written with, field by field."""
    manifest = json.loads(
        (finished_run / "checkpoints" / "step-00000004" / "manifest.json").read_text()
    )
    assert manifest["config"]["training"]["learning_rate"] == 3e-3
    assert manifest["config_hash"] == _job(finished_run).config_hash()
    state = torch.load(
        finished_run / "checkpoints" / "step-00000004" / "state.pt", weights_only=True
    )
    assert state["step"] == 4


def _loader_states(step_dir: Path) -> list[torch.Tensor]:
    """Each rank's DataLoader generator state saved in a step directory (any format)."""
    for name in ("state.pt", "extra.pt"):  # plain: the whole state; DCP: the plain part
        if (step_dir / name).exists():
            saved = torch.load(step_dir / name, weights_only=True)
            return [rank["generators"]["loader"] for rank in saved["rng_states"]]
    raise AssertionError(f"no state in {step_dir}")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_new_rank_continues_the_loader_generator_of_rank_0_in_every_format(
    tmp_path: Path, strategy: str
) -> None:
    """Saved at 1 rank, resumed at 2: the new rank's loader generator continues from rank 0's
    (the plain path always did; the sharded one reseeded nothing), so every rank's loader
    draws the same worker seeds after the resume as in a run that never stopped."""
    job = tmp_path / "job.yaml"
    data = _job_dict(tmp_path / "out", max_steps=4)
    data["strategy"] = {"name": strategy}
    data["task_options"]["n_layer"] = 2  # FSDP wraps repeated blocks
    data["checkpoint"] = {"every": 2, "keep_last_n": 5}
    job.write_text(yaml.safe_dump(data))
    train(job, 1)
    second = train(job, 2, "--set", "training.max_steps=8", "--allow-config-change")
    assert "resumed from" in second
    states = _loader_states(tmp_path / "out" / "checkpoints" / "step-00000008")
    assert len(states) == 2
    assert torch.equal(states[0], states[1]), "rank 1's loader generator did not continue rank 0's"


def test_a_sharded_extra_written_before_the_shared_resume_path_still_restores() -> None:
    """DCP/DeepSpeed checkpoints saved their plain part without ``world_size`` and, without a
    scaler, without ``amp_state``: restore_run_state takes them as they are."""
    from gpu_training.data import GlobalBatchSampler
    from gpu_training.ddp import DistributedContext
    from gpu_training.resume import capture_run_state, restore_run_state

    ctx = DistributedContext()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    sampler = GlobalBatchSampler(64, 8, 8, ctx, seed=0)
    gen = torch.Generator().manual_seed(5)
    saved = capture_run_state(ctx, step=3, scheduler=sched, sampler=sampler, generators={"g": gen})
    old = {k: v for k, v in saved.items() if k not in ("world_size", "amp_state")}
    gen.manual_seed(99)
    fresh = torch.optim.lr_scheduler.StepLR(opt, 1)
    assert restore_run_state(old, ctx, scheduler=fresh, sampler=sampler, generators={"g": gen}) == 3
    assert torch.equal(gen.get_state(), torch.Generator().manual_seed(5).get_state())
