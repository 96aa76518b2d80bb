"""A NaN/Inf on any rank is skipped on every rank alike, in every precision, and named.

The stepper's guard (``max_nonfinite_steps``) in one process; then the Trainer on 2 gloo
ranks (DDP and FSDP2, bf16 and fp32; FSDP2 x TP 2, fp32) with a NaN planted in rank 1's
loss at step 7 (tests/scripts/nan_charlm.py): every rank skips step 7, the weights stay finite
and equal across the ranks, the warning names rank 1, and a NaN that never goes away stops
the run at the limit on every rank. Without the guard (the negative control) the NaN reaches every
replica's weights.
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from dist_harness import REPO_ROOT, TESTS_DIR, run_python
from gpu_training.amp import MixedPrecisionStepper, NonFiniteError, NonFiniteStep
from gpu_training.config import ConfigError
from gpu_training.job import JobConfig
from gpu_training.nonfinite_guard import NonFiniteGuard

# --- the stepper, in one process ----------------------------------------------------------------


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8, bias=False), nn.Tanh(), nn.Linear(8, 1, bias=False))


def _step(stepper: MixedPrecisionStepper, model: nn.Module, poison: float = 1.0) -> None:
    with stepper.autocast():
        loss = model(torch.ones(3, 4)).float().pow(2).mean() * poison
    stepper.backward(loss)
    stepper.step_async(model.parameters(), 0, names=model.named_parameters)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_nan_step_is_skipped_counted_and_named(precision: str) -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    stepper = MixedPrecisionStepper(opt, precision, max_grad_norm=1.0, max_nonfinite_steps=3)
    _step(stepper, model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    adam_steps = [float(opt.state[p]["step"]) for p in model.parameters()]

    _step(stepper, model, poison=math.nan)
    assert stepper.last_step_skipped and stepper.skipped_steps == 1
    assert stepper.last_nonfinite == NonFiniteStep(
        loss_ranks=(0,), parameter="0.weight", in_a_row=1
    )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [float(opt.state[p]["step"]) for p in model.parameters()] == adam_steps
    assert "non-finite loss on rank 0 (first non-finite gradient: 0.weight)" in (
        stepper.last_nonfinite.describe()
    )

    _step(stepper, model, poison=math.inf)
    assert stepper.nonfinite_in_a_row == 2
    _step(stepper, model)  # a finite step resets the count and trains
    assert stepper.last_nonfinite is None and stepper.nonfinite_in_a_row == 0
    assert not torch.equal(before["0.weight"], model.state_dict()["0.weight"])
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())


def test_fp16_scaler_overflows_are_not_counted_but_a_nan_loss_is() -> None:
    """fp16: the loss scaler's calibration skips (a finite loss whose scaled gradients
    overflow) are its business, not a non-finite step; a NaN loss is both."""
    model = _model()
    stepper = MixedPrecisionStepper(
        torch.optim.SGD(model.parameters(), lr=0.1), "fp16", device="cpu", max_nonfinite_steps=2
    )
    _step(stepper, model, poison=1e35)  # finite, but x 65536 overflows
    assert stepper.last_step_skipped and stepper.last_nonfinite is None
    assert stepper.nonfinite_in_a_row == 0 and stepper.loss_scale == 32768.0
    _step(stepper, model, poison=math.nan)
    assert stepper.last_step_skipped and stepper.nonfinite_in_a_row == 1
    assert stepper.last_nonfinite is not None and stepper.last_nonfinite.loss_ranks == (0,)
    _step(stepper, model)
    assert not stepper.last_step_skipped and stepper.nonfinite_in_a_row == 0


def test_gradients_alone_are_named_when_the_loss_was_finite() -> None:
    model = _model()
    model[2].weight.register_hook(lambda grad: grad * math.inf)
    stepper = MixedPrecisionStepper(
        torch.optim.SGD(model.parameters(), lr=0.1), "fp32", max_nonfinite_steps=2
    )
    _step(stepper, model)
    bad = stepper.last_nonfinite
    assert bad is not None and bad.loss_ranks == () and bad.parameter == "2.weight"
    assert bad.describe().startswith("non-finite gradients (the loss was finite on every rank)")


def test_without_the_guard_the_nan_reaches_the_weights() -> None:
    """The negative control: the same NaN step with the guard off poisons the model."""
    model = _model()
    stepper = MixedPrecisionStepper(torch.optim.SGD(model.parameters(), lr=0.1), "fp32")
    _step(stepper, model, poison=math.nan)
    assert stepper.last_nonfinite is None and not stepper.last_step_skipped
    assert not torch.isfinite(model.state_dict()["0.weight"]).all()


def test_the_flag_is_zeroed_only_after_a_step_that_set_it() -> None:
    """A finite check leaves the flag at 0.0 (read on the host): the next check skips zero_."""
    guard = NonFiniteGuard()
    good, bad = [torch.ones(3), torch.ones(2)], [torch.ones(3), torch.tensor([1.0, math.nan])]
    inf = [torch.tensor([math.inf]), torch.ones(2)]
    order = [good, good, bad, good, inf, bad, good, good]
    zeros = []
    for grads in order:
        with _CountOps() as ops:
            flagged = guard.nonfinite_now(None, grads)
        assert flagged == (grads is not good)  # a flag left set would flag the next good step
        zeros.append(ops.count["aten.zero_.default"])
    assert zeros == [1, 0, 0, 1, 0, 1, 1, 0]  # first use, then only after a set flag
    assert guard.nonfinite_now(None, bad) and not guard.nonfinite_now(None, [])
    assert not guard.nonfinite_now(None, good)  # a step without gradients marks nothing zeroed


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count[str(func)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("clip", [None, 1.0])
def test_a_fused_optimizer_skips_on_the_device_and_is_told_a_step_later(
    clip: float | None,
) -> None:
    """A fused optimizer (the Trainer's on a GPU; on the CPU here) gets the flag as its
    ``found_inf`` and skips the step itself: the host reads the flag at the next step, so
    it never waits for the step it queued. Weights, moments and step counts are untouched,
    the diagnosis names the step it happened at (``steps_ago=1``) and the parameter."""
    from gpu_training.amp import nonfinite_warning

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    stepper = MixedPrecisionStepper(
        opt, "fp32", max_grad_norm=clip, max_nonfinite_steps=2, defer_on_cpu=True
    )
    _step(stepper, model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
    adam_steps = [float(opt.state[p]["step"]) for p in model.parameters()]

    _step(stepper, model, poison=math.nan)  # step 2: skipped on the device, not yet known
    assert stepper.last_nonfinite is None and stepper.skipped_steps == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(
        torch.equal(m, opt.state[p]["exp_avg"])
        for m, p in zip(moments, model.parameters(), strict=True)
    )
    assert [float(opt.state[p]["step"]) for p in model.parameters()] == adam_steps

    _step(stepper, model)  # step 3 reads step 2's flags, and trains
    assert stepper.last_nonfinite == NonFiniteStep(
        loss_ranks=(0,), parameter="0.weight", in_a_row=1, steps_ago=1
    )
    assert stepper.skipped_steps == 1
    assert nonfinite_warning(stepper, 3) == (
        "warning: step 2: non-finite loss on rank 0 (first non-finite gradient: 0.weight): "
        "skipped on every rank (1 in a row; the run stops at 2)"
    )
    assert not torch.equal(before["0.weight"], model.state_dict()["0.weight"])

    # settle: read at once (a log or checkpoint step), the step named is the step taken
    _step(stepper, model, poison=math.inf)
    assert nonfinite_warning(stepper, 4, settle=True) is not None
    assert stepper.last_nonfinite is not None and stepper.last_nonfinite.steps_ago == 0
    _step(stepper, model, poison=math.nan)
    with pytest.raises(NonFiniteError, match=r"step 5: .*2 steps in a row"):
        nonfinite_warning(stepper, 5, settle=True)
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())


def test_on_the_cpu_a_fused_optimizer_is_guarded_at_once() -> None:
    """The Trainer's fused CPU AdamW: the flag is on the host already, so the step is skipped
    before the optimizer is called and told at once (``steps_ago=0``), nothing deferred."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    stepper = MixedPrecisionStepper(opt, "fp32", max_nonfinite_steps=2)
    _step(stepper, model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    adam_steps = [float(opt.state[p]["step"]) for p in model.parameters()]
    _step(stepper, model, poison=math.nan)
    assert stepper.last_nonfinite == NonFiniteStep(
        loss_ranks=(0,), parameter="0.weight", in_a_row=1, steps_ago=0
    )
    assert stepper.skipped_steps == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [float(opt.state[p]["step"]) for p in model.parameters()] == adam_steps


def test_without_the_guard_a_fused_optimizer_takes_the_nan() -> None:
    """The negative control of the device-side skip: no guard, no ``found_inf``."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    stepper = MixedPrecisionStepper(opt, "fp32")
    _step(stepper, model, poison=math.nan)
    assert not torch.isfinite(model.state_dict()["0.weight"]).all()


def test_max_nonfinite_steps_is_checked() -> None:
    with pytest.raises(ValueError, match="max_nonfinite_steps must be >= 1"):
        MixedPrecisionStepper(torch.optim.SGD(_model().parameters(), lr=0.1), max_nonfinite_steps=0)
    with pytest.raises(ConfigError, match="max_nonfinite_steps"):
        JobConfig.from_dict({"training": {"max_nonfinite_steps": 0}})
    off = JobConfig.from_dict({"training": {"max_nonfinite_steps": None}})
    on = JobConfig.from_dict({"training": {"max_nonfinite_steps": 3}})
    assert off.config_hash() == on.config_hash()  # a safety stop, not the step's math


# --- the Trainer on 2 gloo ranks ----------------------------------------------------------------

STEPS = 10


def _job(tmp_path: Path, strategy: str, precision: str, guard: int | None = 5) -> Path:
    tp = strategy == "fsdp_tp"  # FSDP x TP 2 on 2 ranks: one replica, 8 samples a micro-batch
    name = "fsdp" if tp else strategy
    job = {
        "task": "nan_charlm:task",
        "task_options": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
        "training": {
            "global_batch_size": 8,
            "per_device_batch_size": 8 if tp else 4,
            "learning_rate": 3e-3,
            "warmup_steps": 2,
            "max_steps": STEPS,
            "precision": precision,
            "seed": 3,
            "max_nonfinite_steps": guard,
        },
        "strategy": {
            "name": name,
            **({"block_classes": ["Block"]} if name == "fsdp" else {}),
            **({"tensor_parallel": 2} if tp else {}),
        },
        "checkpoint": {"every": STEPS, "keep_last_n": 1},
        "run": {
            "output_dir": str(tmp_path / "out"),
            "log_every": 5,
            "eval_every": STEPS,  # one evaluation, at the end: nan_charlm prints its weights
            "progress": False,
            "plot": False,
            "tensorboard": False,
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _train(job: Path, nan_steps: str, fused: bool = False) -> tuple[int, str]:
    paths = [REPO_ROOT / "src", TESTS_DIR, TESTS_DIR / "scripts"]
    proc = run_python(
        ["-m", "gpu_training", "train", str(job), "--nproc", "2"],
        timeout=150,
        cwd=REPO_ROOT,
        env={
            "PYTHONPATH": ":".join(map(str, paths)),
            "NAN_RANK": "1",
            "NAN_STEPS": nan_steps,
            "NAN_FUSED": "1" if fused else "0",
            "OMP_NUM_THREADS": "1",
        },
    )
    return proc.returncode, proc.stdout + proc.stderr


def _final_model(out: Path) -> dict[str, Any]:
    step = sorted((out / "checkpoints").glob("step-*"))[-1]
    return torch.load(step / "state.pt", weights_only=True)["model_state"]


@pytest.mark.multirank
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("strategy", "precision", "fused"),
    [
        ("ddp", "bf16", False),
        ("ddp", "fp32", False),
        ("fsdp", "bf16", False),
        ("ddp", "fp32", True),
        ("fsdp_tp", "fp32", False),
    ],
)
def test_a_nan_on_rank_1_at_step_7_is_skipped_on_every_rank(
    tmp_path: Path, strategy: str, precision: str, fused: bool
) -> None:
    """``fused``: AdamW fused, the GPU's optimizer: the skip happens on the device and the
    host learns of it a step later; the outcome must be the same."""
    rc, text = _train(_job(tmp_path, strategy, precision), "7", fused=fused)
    assert rc == 0, text[-3000:]
    assert (
        text.count("warning: step 7: non-finite loss on rank 1 (first non-finite gradient: ") == 1
    )
    assert "skipped on every rank (1 in a row; the run stops at 5)" in text
    rows = [
        json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in rows if r.get("split") == "train"]
    assert [r["step"] for r in train] == [5, 10]
    assert train[-1]["skipped_steps"] == 1.0  # the mean over ranks: every rank skipped it
    assert all(math.isfinite(r["loss"]) for r in train)
    if strategy == "ddp":  # replicas: every rank's weights, checksummed where they are
        sums = {
            int(r): s for r, s in _re_all(r"WEIGHTS rank=(\d) sum=(-?0x[0-9a-f.]+p[-+]\d+)", text)
        }
        assert sums.keys() == {0, 1} and sums[0] == sums[1], text[-2000:]
    if strategy.startswith("fsdp"):
        assert _consolidated_is_finite(tmp_path / "out")
    else:
        assert all(torch.isfinite(v).all() for v in _final_model(tmp_path / "out").values())


def _re_all(pattern: str, text: str) -> list[tuple[str, str]]:
    import re

    return re.findall(pattern, text)


def _consolidated_is_finite(out: Path) -> bool:
    from gpu_training.checkpoint import consolidate

    step = sorted((out / "checkpoints").glob("step-*"))[-1]
    target = consolidate(step, out / "full.pt")
    tensors = torch.load(target, weights_only=True)
    return bool(tensors) and all(torch.isfinite(v).all() for v in tensors.values())


@pytest.mark.multirank
@pytest.mark.timeout(200)
def test_a_nan_that_stays_stops_the_run_on_every_rank_naming_rank_1(tmp_path: Path) -> None:
    """The stop is one line naming the step, the rank and the gradient, exit code 3 on every
    rank: a decision all ranks take at the same step, not a crash (no traceback)."""
    rc, text = _train(_job(tmp_path, "ddp", "fp32", guard=2), "3-")
    assert rc == 3, text[-3000:]
    assert "warning: step 3: non-finite loss on rank 1" in text
    stop = [line for line in text.splitlines() if "2 steps in a row were non-finite" in line]
    assert len(stop) == 1, text[-3000:]
    assert stop[0].startswith(
        "gpu-training: error: step 4: non-finite loss on rank 1 (first non-finite gradient: "
    ), stop
    assert "Traceback" not in text and "Root Cause" not in text, text[-3000:]


@pytest.mark.multirank
@pytest.mark.timeout(200)
def test_without_the_guard_the_nan_on_one_rank_poisons_every_replica(tmp_path: Path) -> None:
    """The negative control of the test above: guard off, the NaN is all-reduced."""
    rc, text = _train(_job(tmp_path, "ddp", "fp32", guard=None), "7")
    assert rc == 0, text[-3000:]
    assert "non-finite" not in text
    assert not all(torch.isfinite(v).all() for v in _final_model(tmp_path / "out").values())
