"""The fp16 loss scale crosses between DeepSpeed ZeRO and torch's GradScaler, both ways.

End to end, through ``train`` on 2 gloo ranks: the bias-free charlm job of
tests/resume_jobs.py in fp16, 9 steps, a checkpoint every 3. A ZeRO-2 run stopped after step
3 resumes under DDP, and that DDP run stopped after step 6 under ZeRO-2 (DDP's own scale
stays at the default on this job: a DDP source that lowered it is one that resumed
DeepSpeed's); each ends (3 clean steps later) with the
scale it was written with, the clean-step count grown by 3 and the skipped steps carried,
read from the files the resumed run wrote (DeepSpeed's optimizer file, ``state.pt``). The
ZeRO-2 source lowered its scale from the default 2**16 (the precondition that lets a reset be
seen), and the negative control — the same resumes with every loss scale reset to the
default — misses in both directions (under DDP the scale stays 2**16; under ZeRO-2 the
default overflows twice into the same scale, but the clean-step count starts again; that
direction is marked ``matrix``, ``make test-matrix``).

At the state level, the mapping is checked on DeepSpeed's own ``DynamicLossScaler`` and
torch's ``GradScaler`` (no engine): what maps, when each grows next, what cannot (hysteresis).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml

from dist_harness import run_ranks
from gpu_training.amp import MixedPrecisionStepper
from gpu_training.checkpoint import CheckpointError
from gpu_training.checkpoint.loss_scale import (
    LossScale,
    carry_into_engine,
    carry_into_stepper,
    deepspeed_loss_scale,
    loss_scale_of,
)
from resume_jobs import has_deepspeed, job_file, layout
from train_jobs import train

STEPS, EVERY = 9, 3
DEFAULT = 2.0**16  # GradScaler's init_scale and DeepSpeed's 2**initial_scale_power
needs_deepspeed = pytest.mark.skipif(not has_deepspeed("zero2x2"), reason="needs deepspeed")


# -- the state level: DeepSpeed's and torch's own scaler classes --------------------------------


def _ds_scaler(window: int = 10, hysteresis: int = 2) -> Any:
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    return DynamicLossScaler(DEFAULT, window, 1.0, hysteresis, False)


def _grow_steps(scaler: Any) -> int:
    """Clean steps until DeepSpeed's scaler grows, by its own update (no overflow: no dist)."""
    before = scaler.cur_scale
    for k in range(1, 1000):
        scaler.update_scale(False)
        if scaler.cur_scale != before:
            return k
    raise AssertionError("never grew")


@needs_deepspeed
def test_a_grad_scaler_state_maps_into_deepspeeds_scaler() -> None:
    engine = SimpleNamespace(optimizer=SimpleNamespace(loss_scaler=_ds_scaler()), skipped_steps=0)
    state = {"amp_state": {"scaler": {"scale": 512.0, "_growth_tracker": 4}, "skipped_steps": 3}}
    assert carry_into_engine(engine, loss_scale_of(state))
    scaler = engine.optimizer.loss_scaler
    assert (scaler.cur_scale, scaler.cur_hysteresis, engine.skipped_steps) == (512.0, 2, 3)
    # DeepSpeed grows at the (window - clean + 1)-th clean step from here, by its own rule
    assert _grow_steps(scaler) == 10 - 4 + 1 and scaler.cur_scale == 1024.0


@needs_deepspeed
def test_deepspeeds_scaler_maps_into_a_grad_scaler_and_back_into_deepspeed() -> None:
    written = _ds_scaler(window=10)
    written.cur_scale, written.cur_iter, written.last_overflow_iter = 4096.0, 40, 33
    written.cur_hysteresis = 1  # one overflow absorbed: GradScaler has nothing to hold it
    record = deepspeed_loss_scale(written, skipped_steps=5)
    assert record is not None and (record.scale, record.clean_steps) == (4096.0, 6)

    stepper = MixedPrecisionStepper(
        torch.optim.SGD([torch.nn.Parameter(torch.ones(2))]), "fp16", device="cpu"
    )
    assert carry_into_stepper(stepper, record)
    saved = stepper.state_dict()["scaler"]
    assert (saved["scale"], saved["_growth_tracker"], saved["growth_interval"]) == (4096.0, 6, 2000)
    assert stepper.skipped_steps == 5

    resumed = _ds_scaler(window=10)  # DeepSpeed to DeepSpeed (another layout): verbatim
    carry_into_engine(SimpleNamespace(optimizer=SimpleNamespace(loss_scaler=resumed)), record)
    assert vars(resumed) == vars(written)


@needs_deepspeed
def test_deepspeeds_clean_count_restarts_at_each_growth() -> None:
    scaler = _ds_scaler(window=4)
    scaler.cur_iter, scaler.last_overflow_iter = 20, 13  # 6 clean: grew after the 5th
    record = deepspeed_loss_scale(scaler)
    assert record is not None and record.clean_steps == 1
    assert deepspeed_loss_scale(SimpleNamespace(dynamic=False, cur_scale=8.0)) is None  # static


def test_a_run_without_a_dynamic_scale_carries_none() -> None:
    assert loss_scale_of({"amp_state": {"precision": "bf16", "scaler": {}}}) is None
    assert loss_scale_of({"amp_state": None}) is None
    bf16 = MixedPrecisionStepper(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))]), "bf16")
    assert not carry_into_stepper(bf16, LossScale(8.0, 1))
    assert bf16.loss_scale == 1.0
    with pytest.raises(CheckpointError, match="'loss_scale' is not a loss scale"):
        loss_scale_of({"loss_scale": {"scale": "big"}})


def test_the_resume_line_says_the_fp16_scale_carried() -> None:
    from gpu_training.job import JobConfig
    from gpu_training.resume import layout_change

    def job(precision: str) -> JobConfig:
        strategy = {"name": "deepspeed", "zero_stage": 2}
        return JobConfig.from_dict({"strategy": strategy, "training": {"precision": precision}})

    def written(precision: str) -> dict[str, Any]:
        config = {"strategy": {"name": "ddp"}, "training": {"precision": precision}}
        return {"world_size": 2, "config": config}

    said = "written by DDP on 2 ranks under ZeRO-2 on 4: optimizer state resharded"
    assert layout_change(job("fp16"), written("fp16"), 4) == f"{said}, fp16 loss scale carried"
    assert layout_change(job("bf16"), written("bf16"), 4) == said
    assert layout_change(job("fp16"), written("bf16"), 4) == said  # nothing to carry


# -- end to end: train, stopped, resumed under the other scaler ---------------------------------


def _job(out: Path, name: str) -> tuple[Path, int]:
    strategy, nproc = layout(name)
    path = job_file(out, strategy)
    job = yaml.safe_load(path.read_text())
    job["training"].update(precision="fp16", max_steps=STEPS)
    job["checkpoint"].update(every=EVERY, keep_last_n=STEPS)
    job["run"]["eval_every"] = STEPS
    path.write_text(yaml.safe_dump(job))
    return path, nproc


def _scale(out: Path, step: int) -> LossScale:
    """The loss scale a run wrote at ``step``, read from its files as they are."""
    step_dir = out / "checkpoints" / f"step-{step:08d}"
    if (step_dir / "state.pt").exists():
        amp = torch.load(step_dir / "state.pt", weights_only=True)["amp_state"]
        scaler = amp["scaler"]
        return LossScale(scaler["scale"], scaler["_growth_tracker"], amp["skipped_steps"])
    from gpu_training.checkpoint.zero_read import load_deepspeed_file

    optim = load_deepspeed_file(step_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    model = load_deepspeed_file(step_dir / "mp_rank_00_model_states.pt")
    scaler = optim["optimizer_state_dict"]["loss_scaler"]
    clean = scaler.cur_iter - scaler.last_overflow_iter - 1  # below the window: no growth yet
    return LossScale(scaler.cur_scale, clean, model["skipped_steps"])


def _stopped_at(run: Path, out: Path, step: int) -> Path:
    """A copy of ``run`` as it stood after ``step`` (its later checkpoints removed)."""
    shutil.copytree(run, out)
    for later in range(step + EVERY, STEPS + 1, EVERY):
        shutil.rmtree(out / "checkpoints" / f"step-{later:08d}")
    return out


def _holds(source: Path, out: Path, step: int) -> None:
    """``out`` resumed ``source`` at ``step``: EVERY clean steps later, the same scale."""
    then, now = _scale(source, step), _scale(out, step + EVERY)
    assert now.scale == then.scale, f"scale {now.scale} after resuming {then.scale}"
    assert now.clean_steps == then.clean_steps + EVERY, (then, now)
    assert now.skipped_steps == then.skipped_steps, (then, now)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """ZeRO-2 x 2 for 9 steps; its step 3 resumed under DDP x 2; that run's step 6 under
    ZeRO-2 x 2 again (DDP's own scale stays at the default here: a DDP source that lowered
    it is one that resumed DeepSpeed's). Each run with what ``train`` printed."""
    tmp = tmp_path_factory.mktemp("fp16")
    zero = tmp / "zero2x2"
    runs = {"zero": (zero, train(*_job(zero, "zero2x2")))}
    assert _scale(zero, EVERY).scale < DEFAULT, "ZeRO-2 never lowered its scale: nothing to see"
    ddp = _stopped_at(zero, tmp / "ddp2", EVERY)
    runs["zero-ddp"] = (ddp, train(*_job(ddp, "ddp2")))
    again = _stopped_at(ddp, tmp / "zero-again", 2 * EVERY)
    runs["ddp-zero"] = (again, train(*_job(again, "zero2x2")))
    return runs


@pytest.mark.multirank
@pytest.mark.slow
@pytest.mark.timeout(600)
@needs_deepspeed
@pytest.mark.parametrize(
    ("hop", "source", "step", "said"),
    [
        ("zero-ddp", "zero", EVERY, "ZeRO-2 on 2 ranks under DDP on 2"),
        ("ddp-zero", "zero-ddp", 2 * EVERY, "DDP on 2 ranks under ZeRO-2 on 2"),
    ],
    ids=["zero-ddp", "ddp-zero"],
)
def test_the_fp16_loss_scale_crosses_between_deepspeed_and_ddp(
    chain: dict[str, tuple[Path, str]], hop: str, source: str, step: int, said: str
) -> None:
    out, printed = chain[hop]
    line = f"(step {step} written by {said}: optimizer state resharded, fp16 loss scale carried)"
    assert line in printed, printed
    _holds(chain[source][0], out, step)


@pytest.mark.multirank
@pytest.mark.slow
@needs_deepspeed
def test_deepspeeds_own_files_give_its_scale_with_its_counters(
    chain: dict[str, tuple[Path, str]],
) -> None:
    """What a ZeRO checkpoint read per parameter hands a resume (into DDP, or into ZeRO on
    another layout, which takes DeepSpeed's counters verbatim)."""
    from gpu_training.checkpoint.zero_read import load_deepspeed_file
    from gpu_training.checkpoint.zero_source import ZeroSource

    step_dir = chain["zero"][0] / "checkpoints" / f"step-{EVERY:08d}"
    run_state, extra = ZeroSource(step_dir).run_state()
    record = loss_scale_of(run_state)
    optim = load_deepspeed_file(step_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    scaler = optim["optimizer_state_dict"]["loss_scaler"]
    assert record is not None and record.scale == scaler.cur_scale < DEFAULT
    native = record.deepspeed
    assert native is not None and native == {k: getattr(scaler, k) for k in native}
    assert native["cur_hysteresis"] == 1  # DeepSpeed absorbed one overflow
    assert record.skipped_steps == 2 and "loss_scale" not in extra  # the caller's, untouched


def _resetting_the_loss_scale(argv: list[str]) -> None:
    """A rank of ``train`` whose resume leaves every loss scaler at its default."""
    import gpu_training.checkpoint.zero_reshard as zero_reshard
    import gpu_training.resume as resume
    from gpu_training.cli import main

    resume.carry_into_stepper = lambda *args: False
    zero_reshard.carry_into_engine = lambda *args: False
    code = main(argv)
    if code != 0:
        raise SystemExit(code)


@pytest.mark.multirank
@pytest.mark.slow
@pytest.mark.timeout(600)
@needs_deepspeed
@pytest.mark.parametrize(
    ("source", "step", "target"),
    [
        pytest.param("zero", EVERY, "ddp2", id="zero-ddp"),
        pytest.param("zero-ddp", 2 * EVERY, "zero2x2", id="ddp-zero", marks=pytest.mark.matrix),
    ],
)
def test_the_negative_control_resets_the_scale_and_misses(
    chain: dict[str, tuple[Path, str]], tmp_path: Path, source: str, step: int, target: str
) -> None:
    written = chain[source][0]
    out = _stopped_at(written, tmp_path / "reset", step)
    job, nproc = _job(out, target)
    run_ranks(_resetting_the_loss_scale, nproc, args=(["train", str(job)],), timeout=300)
    with pytest.raises(AssertionError, match=r"scale|LossScale"):
        _holds(written, out, step)
