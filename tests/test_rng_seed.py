"""The micro-batch stream's seeds: one value per (seed, step, index), whatever computes it.

A checkpoint resumes bitwise only if the seeds a resumed run derives are the ones the
interrupted run used, so the values are pinned here (computed by the scalar splitmix64 the
toolkit shipped first) and the table :func:`micro_batch_seed` reads is checked against an
independent scalar implementation across its block boundaries.
"""

from __future__ import annotations

import builtins
from typing import Any

import pytest

import gpu_training.rng as rng
from gpu_training.rng import micro_batch_seed

MASK = (1 << 64) - 1

# (seed, step, index) -> the seed the first (scalar, pure-Python) implementation returned
PINNED = {
    (0, 0, 0): 1279368494785126216,
    (0, 1, 0): 2482289063980384216,
    (0, 0, 1): 1700482428262628912,
    (1234, 5000, 7): 2594722854295492994,
    (2**63 - 1, 2**40, 3): 6886806430826622030,
    (-5, 1023, 2): 5009965674084684651,
    (7, 1024, 2): 112432930518816779,
}


def splitmix(x: int, part: int) -> int:
    """splitmix64's mixing round, written out again for the test."""
    z = ((x ^ (part & MASK)) + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference(seed: int, step: int, index: int) -> int:
    return splitmix(splitmix(splitmix(0, seed), step), index) >> 1


@pytest.fixture(autouse=True)
def _fresh_tables() -> Any:
    rng._TABLES.clear()
    yield
    rng._TABLES.clear()


def test_pinned_values_do_not_change() -> None:
    for args, value in PINNED.items():
        assert micro_batch_seed(*args) == value, args
        assert reference(*args) == value, args


@pytest.mark.parametrize("seed", [0, 1, 42, 2**40 + 3, 2**63 - 1, -5])
def test_the_table_equals_the_scalar_formula_across_blocks(seed: int) -> None:
    block = rng._BLOCK
    steps = [*range(0, 3 * block, 37), block - 1, block, 2 * block - 1, 2 * block]
    steps += [10**9, 2**40, MASK]
    for index in (0, 1, 5, 1000, 2**62):
        for step in steps:
            got = micro_batch_seed(seed, step, index)
            assert got == reference(seed, step, index), (seed, step, index)
            assert 0 <= got < 2**63


def test_steps_out_of_the_table_range_use_the_formula() -> None:
    assert micro_batch_seed(3, -1, 2) == reference(3, -1, 2)
    assert micro_batch_seed(3, MASK + 5, 2) == reference(3, MASK + 5, 2)


def test_a_step_twice_and_backwards_gives_the_same_value() -> None:
    # resume rewinds: an earlier block is computed again, not read from a stale one
    later = micro_batch_seed(9, 5000, 1)
    earlier = micro_batch_seed(9, 10, 1)
    assert micro_batch_seed(9, 5000, 1) == later
    assert micro_batch_seed(9, 10, 1) == earlier == reference(9, 10, 1)


def test_the_tables_stay_bounded() -> None:
    for index in range(1000):
        micro_batch_seed(0, 0, index)
    assert len(rng._TABLES) <= 256


def test_without_numpy_the_values_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_numpy(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "numpy" or name.startswith("numpy."):
            raise ImportError("no numpy here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_numpy)
    for args, value in PINNED.items():
        assert micro_batch_seed(*args) == value, args
