"""MixedPrecisionTrainer: accumulation math, fp16 loss scaling on CPU, unscale-before-clip."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gpu_training.amp import (
    GradNorm,
    MixedPrecisionTrainer,
    autocast_dtype,
    needs_grad_scaler,
    resolve_precision,
    should_step,
)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))


def _data(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, 2, generator=g)


def test_mixed_precision_trainer_is_the_stepper_under_the_guides_name() -> None:
    import gpu_training
    import gpu_training.amp
    from gpu_training import MixedPrecisionStepper, MixedPrecisionTrainer

    assert MixedPrecisionTrainer is MixedPrecisionStepper
    assert gpu_training.amp.MixedPrecisionTrainer is gpu_training.amp.MixedPrecisionStepper
    assert gpu_training.amp.MixedPrecisionStepper is MixedPrecisionStepper
    names = {"MixedPrecisionStepper", "MixedPrecisionTrainer"}
    assert names <= set(gpu_training.amp.__all__) and names <= set(gpu_training.__all__)


def test_lint_knows_the_stepper_by_both_names() -> None:
    from gpu_training.diagnostics import lint_source

    for name in ("MixedPrecisionStepper", "MixedPrecisionTrainer"):
        source = f"""
from gpu_training.amp import {name}

def run(ctx, optimizer, model):
    amp = {name}(optimizer, "bf16")
    if ctx.rank == 0:
        amp.step(model.parameters(), 0)
"""
        assert [(f.line, f.code) for f in lint_source(source)] == [(7, "GT014")], name


def test_should_step_boundaries() -> None:
    assert [should_step(i, 4) for i in range(8)] == [False, False, False, True] * 2
    assert all(should_step(i, 1) for i in range(3))
    with pytest.raises(ValueError, match="grad_accum_steps"):
        should_step(0, 0)


def test_precision_policy() -> None:
    assert needs_grad_scaler("fp16") and not needs_grad_scaler("bf16")
    assert not needs_grad_scaler("fp32")
    assert resolve_precision("auto", "cpu") == "fp32"  # CPU: fp32 unless asked
    assert resolve_precision("bf16", "cpu") == "bf16"
    assert autocast_dtype("bf16") is torch.bfloat16 and autocast_dtype("fp32") is None
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp8", "cpu")
    with pytest.raises(ValueError, match="resolve 'auto'"):
        needs_grad_scaler("auto")


def test_accumulation_equals_one_big_batch_fp32() -> None:
    x, y = _data(32)
    big, small = _model(), _model()
    opt_big = torch.optim.AdamW(big.parameters(), lr=1e-2)
    opt_small = torch.optim.AdamW(small.parameters(), lr=1e-2)
    ref = MixedPrecisionTrainer(opt_big, precision="fp32", max_grad_norm=0.5)
    acc = MixedPrecisionTrainer(opt_small, precision="fp32", grad_accum_steps=4, max_grad_norm=0.5)
    for _ in range(3):
        ref.backward(nn.functional.mse_loss(big(x), y))
        norm_big = ref.step(big.parameters(), 0)
        norms = []
        for i, (xb, yb) in enumerate(zip(x.chunk(4), y.chunk(4), strict=True)):
            acc.backward(nn.functional.mse_loss(small(xb), yb))
            norms.append(acc.step(small.parameters(), i))
        assert norms[:3] == [None, None, None]
        assert norms[3] == pytest.approx(norm_big, rel=1e-5)
    for a, b in zip(big.parameters(), small.parameters(), strict=True):
        assert (a - b).abs().max().item() <= 1e-6
    assert all(p.grad is None for p in small.parameters())  # zero_grad(set_to_none) on boundary


def test_fp16_overflow_skips_step_and_lowers_scale_on_cpu() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = MixedPrecisionTrainer(opt, precision="fp16", max_grad_norm=1.0)
    assert trainer.scaler.is_enabled() and trainer.loss_scale == 2.0**16
    before = copy.deepcopy(model.state_dict())
    x, y = _data(4)
    loss = nn.functional.mse_loss(model(x), y) * float("inf")  # forced overflow
    trainer.backward(loss)
    norm = trainer.step(model.parameters(), 0)
    assert norm is not None and not torch.isfinite(torch.tensor(norm))
    assert trainer.last_step_skipped and trainer.skipped_steps == 1
    assert trainer.loss_scale == 2.0**15
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed on a skipped step"
    # The next, finite step goes through.
    trainer.backward(nn.functional.mse_loss(model(x), y))
    assert trainer.step(model.parameters(), 0) is not None
    assert not trainer.last_step_skipped
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_fp16_scaler_state_round_trips() -> None:
    model = _model()
    trainer = MixedPrecisionTrainer(torch.optim.SGD(model.parameters(), lr=0.1), precision="fp16")
    x, y = _data(4)
    trainer.backward(nn.functional.mse_loss(model(x), y) * float("inf"))
    trainer.step(model.parameters(), 0)
    for _ in range(3):
        with trainer.autocast():
            loss = nn.functional.mse_loss(model(x), y)
        trainer.backward(loss)
        trainer.step(model.parameters(), 0)
    state = trainer.state_dict()
    fresh = MixedPrecisionTrainer(torch.optim.SGD(model.parameters(), lr=0.1), precision="fp16")
    assert fresh.loss_scale == 2.0**16
    fresh.load_state_dict(state)
    assert fresh.loss_scale == trainer.loss_scale == 2.0**15
    assert fresh.scaler.state_dict() == trainer.scaler.state_dict()  # growth tracker too
    assert fresh.skipped_steps == 1
    bf16 = MixedPrecisionTrainer(torch.optim.SGD(model.parameters(), lr=0.1), precision="bf16")
    with pytest.raises(ValueError, match="precision 'fp16'"):
        bf16.load_state_dict(state)


@pytest.mark.parametrize("use_autocast", [False, True])
def test_fp16_clipping_sees_unscaled_gradients(use_autocast: bool) -> None:
    x, y = _data(16)
    # A large loss puts the true norm far above max_grad_norm.
    y = y * 100.0
    results = {}
    for precision in ("fp32", "fp16"):
        model = _model()
        before = [p.detach().clone() for p in model.parameters()]
        trainer = MixedPrecisionTrainer(
            torch.optim.SGD(model.parameters(), lr=1.0), precision=precision, max_grad_norm=1.0
        )
        for _ in range(12):  # fp16: the first steps may overflow at 2^16 and be skipped
            ctx = trainer.autocast() if use_autocast else torch.autocast("cpu", enabled=False)
            with ctx:
                loss = nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            norm = trainer.step(model.parameters(), 0)
            if not trainer.last_step_skipped:
                break
        assert norm is not None and not trainer.last_step_skipped
        params = list(model.parameters())
        update = torch.cat(
            [(b - p.detach()).flatten() for b, p in zip(before, params, strict=True)]
        )
        results[precision] = (norm, update)
    (norm32, upd32), (norm16, upd16) = results["fp32"], results["fp16"]
    assert norm32 > 100.0  # clipping is active
    tol = 1e-3 if use_autocast else 1e-6
    assert norm16 == pytest.approx(norm32, rel=tol)  # the norm is the unscaled, true norm
    # SGD(lr=1): the update is the clipped gradient, so its norm is max_grad_norm.
    assert upd16.norm().item() == pytest.approx(1.0, rel=1e-3)
    assert upd32.norm().item() == pytest.approx(1.0, rel=1e-4)


def test_bf16_autocast_on_cpu_runs_without_scaler() -> None:
    model = _model()
    trainer = MixedPrecisionTrainer(torch.optim.SGD(model.parameters(), lr=0.1), precision="bf16")
    assert not trainer.scaler.is_enabled() and trainer.loss_scale == 1.0
    x, y = _data(4)
    with trainer.autocast():
        out = model(x)
    assert out.dtype is torch.bfloat16
    trainer.backward(nn.functional.mse_loss(out.float(), y))
    assert trainer.step(model.parameters(), 0) is not None


def test_guide_mixed_precision_loop_runs_as_written() -> None:
    model, loss_fn = _model(), nn.MSELoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x_all, y_all = _data(32)
    loader = list(zip(x_all.chunk(8), y_all.chunk(8), strict=True))
    # --- the guide's snippet, verbatim (precision bf16 works on the CPU too) ---
    trainer = MixedPrecisionTrainer(
        optimizer, precision="bf16", grad_accum_steps=4, max_grad_norm=1.0
    )

    for micro_step, (x, y) in enumerate(loader):
        with trainer.autocast():  # autocast in bf16 (or nullcontext for fp32)
            loss = loss_fn(model(x), y)
        trainer.backward(loss)  # scales loss, divides by accum, backward
        grad_norm = trainer.step(model.parameters(), micro_step)  # steps on boundary
    # --- end ---
    assert grad_norm is not None and micro_step == 7


def test_bad_constructor_arguments() -> None:
    opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="grad_accum_steps"):
        MixedPrecisionTrainer(opt, grad_accum_steps=0)
    with pytest.raises(ValueError, match="max_grad_norm"):
        MixedPrecisionTrainer(opt, max_grad_norm=0.0)
    with pytest.raises(ValueError, match="precision"):
        MixedPrecisionTrainer(opt, precision="half")


# --- the gradient norm: measured when clipping needs it or someone reads it ------------------


class _NormCalls:
    """Counts the passes over the gradients that measure a norm (clip or total)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        # Every pass is one _foreach_norm: gpu_training.grad_norm's (plain tensors alike)
        # and torch's get_total_norm / clip_grad_norm_ (foreach on the CPU too in torch 2.13)
        foreach_norm = torch._foreach_norm

        def counted_foreach(*args: object, **kwargs: object) -> object:
            self.calls += 1
            return foreach_norm(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(torch, "_foreach_norm", counted_foreach)


_TOTAL_NORM = torch.nn.utils.get_total_norm  # torch's own measure


def _eager_norm(model: nn.Module) -> float:
    """The norm measured another way (one flat vector): passes no counter."""
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.cat(grads)))


def test_no_norm_is_computed_on_a_step_where_none_is_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _model()
    trainer = MixedPrecisionTrainer(torch.optim.SGD(model.parameters(), lr=0.1), "fp32", 2)
    x, y = _data(8)
    calls = _NormCalls(monkeypatch)
    for micro in range(6):  # 3 optimizer steps, nobody reads a norm
        with trainer.autocast():
            loss = nn.functional.mse_loss(model(x), y)
        trainer.backward(loss)
        trainer.step_async(model.parameters(), micro)
    assert calls.calls == 0
    # Asked for, it is measured once, on read, and equals the eager measure.
    with trainer.autocast():
        loss = nn.functional.mse_loss(model(x), y)
    trainer.backward(loss)
    trainer.backward(nn.functional.mse_loss(model(x), y))
    expected = _eager_norm(model)
    norm = trainer.step_async(model.parameters(), 7)
    assert isinstance(norm, GradNorm) and not norm.computed and calls.calls == 0
    assert norm.item() == pytest.approx(expected, rel=1e-6) and calls.calls == 1
    assert float(norm) == norm.item() and calls.calls == 1  # read once, kept
    assert norm.tensor().dim() == 0


def test_clipping_measures_the_norm_at_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    models = [_model(), _model()]
    trainers = [
        MixedPrecisionTrainer(torch.optim.SGD(m.parameters(), lr=0.1), "fp32", max_grad_norm=0.1)
        for m in models
    ]
    x, y = _data(8)
    for model, trainer in zip(models, trainers, strict=True):
        trainer.backward(nn.functional.mse_loss(model(x), y))
    expected = _eager_norm(models[0])
    calls = _NormCalls(monkeypatch)
    handle = trainers[0].step_async(models[0].parameters(), 0)
    assert handle is not None and handle.computed and calls.calls == 1
    assert handle.item() == pytest.approx(expected, rel=1e-6)
    assert trainers[1].step(models[1].parameters(), 0) == pytest.approx(handle.item())
    assert torch.equal(models[0][0].weight, models[1][0].weight)  # clipped the same way


def test_norm_read_after_the_next_forward_is_an_error() -> None:
    model = _model()
    trainer = MixedPrecisionTrainer(torch.optim.SGD(model.parameters(), lr=0.1), "fp32")
    x, y = _data(8)
    trainer.backward(nn.functional.mse_loss(model(x), y))
    norm = trainer.step_async(model.parameters(), 0)
    assert norm is not None
    with trainer.autocast():  # the next forward: the step's gradients are let go
        loss = nn.functional.mse_loss(model(x), y)
    with pytest.raises(RuntimeError, match="read it right after step_async"):
        norm.item()
    trainer.backward(loss)
    assert "gone" in repr(norm)
    measured = trainer.step_async(model.parameters(), 0, norm=True)
    assert measured is not None and measured.computed


def test_lazy_norm_refuses_gradients_changed_in_place_by_the_optimizer() -> None:
    class ClearsGrads(torch.optim.SGD):
        def step(self, closure=None):  # type: ignore[no-untyped-def, override]
            out = super().step(closure)
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad.mul_(0)  # as some third-party optimizers do
            return out

    model = _model()
    trainer = MixedPrecisionTrainer(ClearsGrads(model.parameters(), lr=0.1), "fp32")
    x, y = _data(8)
    trainer.backward(nn.functional.mse_loss(model(x), y))
    expected = _eager_norm(model)
    norm = trainer.step_async(model.parameters(), 0)
    assert norm is not None
    with pytest.raises(RuntimeError, match="pass norm=True"):
        norm.item()
    trainer.backward(nn.functional.mse_loss(model(x), y))
    eager = trainer.step_async(model.parameters(), 0, norm=True)
    assert eager is not None and eager.computed and eager.item() > 0
    assert expected > 0


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True),
        lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, maximize=True),
        lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.1, amsgrad=True, foreach=False),
        lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.9, centered=True),
    ],
    ids=["sgd", "adamw", "adam", "rmsprop"],
)
def test_built_in_optimizers_leave_gradients_for_the_lazy_read(make) -> None:  # type: ignore[no-untyped-def]
    model = _model()
    trainer = MixedPrecisionTrainer(make(model.parameters()), "fp32")
    x, y = _data(8)
    for _ in range(3):
        trainer.backward(nn.functional.mse_loss(model(x), y))
        expected = _eager_norm(model)
        norm = trainer.step_async(model.parameters(), 0)
        assert norm is not None and norm.item() == pytest.approx(expected, rel=1e-6)


def test_fp16_overflow_reads_non_finite_from_the_lazy_norm() -> None:
    model = _model()
    trainer = MixedPrecisionTrainer(torch.optim.SGD(model.parameters(), lr=0.1), "fp16")
    x, y = _data(4)
    trainer.backward(nn.functional.mse_loss(model(x), y) * float("inf"))
    norm = trainer.step_async(model.parameters(), 0)
    assert norm is not None and not norm.computed and trainer.last_step_skipped
    assert not torch.isfinite(norm.tensor())  # inf or nan, as step() reports it
    trainer.backward(nn.functional.mse_loss(model(x), y))
    finite = trainer.step_async(model.parameters(), 0)
    assert finite is not None and not trainer.last_step_skipped
    assert 0 < finite.item() < float("inf")


def test_a_measured_grad_norm_is_a_value() -> None:
    norm = GradNorm(torch.tensor(2.0))
    assert norm.computed and norm.item() == 2.0 and float(norm) == 2.0
    assert repr(norm) == "GradNorm(2)"


def test_lazy_norm_covers_the_parameters_passed_not_the_optimizers() -> None:
    """The norm is over ``params`` (as clip_grad_norm_ would see them): a subset of the
    optimizer's, or parameters it does not hold."""
    model = _model()
    first, second = model[0], model[2]
    trainer = MixedPrecisionTrainer(torch.optim.SGD(first.parameters(), lr=0.1), "fp32")
    x, y = _data(8)
    trainer.backward(nn.functional.mse_loss(model(x), y))
    only_first = float(_TOTAL_NORM([p.grad for p in first.parameters()]))
    subset = trainer.step_async(first.parameters(), 0)
    assert subset is not None and subset.item() == pytest.approx(only_first, rel=1e-6)
    trainer.optimizer.zero_grad(set_to_none=True)
    for p in second.parameters():
        p.grad = None
    trainer.backward(nn.functional.mse_loss(model(x), y))
    both = float(_TOTAL_NORM([p.grad for p in model.parameters()]))
    everything = trainer.step_async(model.parameters(), 0)  # second's grads: not the optimizer's
    assert everything is not None and everything.item() == pytest.approx(both, rel=1e-6)


def test_lazy_norm_does_not_walk_the_parameters_unless_read() -> None:
    model = _model()
    trainer = MixedPrecisionTrainer(torch.optim.SGD(model.parameters(), lr=0.1), "fp32")
    x, y = _data(8)
    walked = []

    def params():  # type: ignore[no-untyped-def]
        walked.append(True)
        yield from model.parameters()

    trainer.backward(nn.functional.mse_loss(model(x), y))
    norm = trainer.step_async(params(), 0)
    assert norm is not None and not walked
    assert norm.item() > 0 and walked == [True]
