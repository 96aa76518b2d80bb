"""linear_warmup_cosine_lr: warmup ramp, cosine decay, floor, and checkpointable state."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from gpu_training.schedule import linear_warmup_cosine_lr, warmup_cosine_factor


def _lrs(warmup: int, total: int, ratio: float = 0.0, steps: int | None = None) -> list[float]:
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=2.0)
    sched = linear_warmup_cosine_lr(opt, warmup, total, min_lr_ratio=ratio)
    out = []
    for _ in range(steps or total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_is_linear_and_never_zero() -> None:
    lrs = _lrs(warmup=4, total=10)
    assert lrs[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert lrs[4] == pytest.approx(2.0)  # cosine starts at the peak


def test_cosine_decays_to_floor_and_stays() -> None:
    lrs = _lrs(warmup=0, total=8, ratio=0.1, steps=12)
    assert all(a >= b for a, b in itertools.pairwise(lrs))
    mid = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 8))
    assert lrs[4] == pytest.approx(2.0 * mid)
    assert lrs[8:] == pytest.approx([0.2] * 4)


def test_state_dict_resumes_the_curve() -> None:
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    sched = linear_warmup_cosine_lr(opt, 3, 20)
    for _ in range(7):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    sched2 = linear_warmup_cosine_lr(opt2, 3, 20)
    sched2.load_state_dict(state)
    opt2.param_groups[0]["lr"] = sched2.get_last_lr()[0]
    assert opt2.param_groups[0]["lr"] == pytest.approx(warmup_cosine_factor(7, 3, 20))


@pytest.mark.parametrize(
    ("warmup", "total", "ratio", "match"),
    [
        (-1, 10, 0.0, "warmup_steps"),
        (5, 0, 0.0, "total_steps"),
        (11, 10, 0.0, "exceed"),
        (1, 10, 1.5, "min_lr_ratio"),
    ],
)
def test_bad_arguments(warmup: int, total: int, ratio: float, match: str) -> None:
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    with pytest.raises(ValueError, match=match):
        linear_warmup_cosine_lr(opt, warmup, total, ratio)
