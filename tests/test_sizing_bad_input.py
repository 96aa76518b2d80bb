"""Every numeric flag of ``plan`` and ``find-batch`` refuses what cannot mean anything.

Zero or negative where that is meaningless, ``inf``, ``nan``, ``1e400`` (a float overflow),
and numbers too large to be a real machine or model: one ``gpu-training: error:`` line that
names the flag and what it expects, exit code 2, nothing on stdout, nothing written. Before
these checks, ``--gpu-memory 1e400GB`` was an ``OverflowError``, ``--seq 1e23`` a torch
traceback, ``--gpus 1e23`` an ``OverflowError`` in the launch command and ``--lr inf`` an
error about a field named ``base_lr``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from gpu_training.cli import build_parser, main
from gpu_training.commands._plan_cost import MAX_STEPS, MAX_TOKENS
from gpu_training.commands._sizing_inputs import (
    MAX_BANDWIDTH,
    MAX_BATCH,
    MAX_DIMENSION,
    MAX_GPUS,
)

REPO = Path(__file__).resolve().parents[1]
SHAPE = ["--params", "124M", "--layers", "12", "--hidden", "768", "--gpu-memory", "80"]
# Everything valid and quick (the estimate, a few probes, no timing): only the flag under test,
# given last (argparse keeps the last value), can fail.
FIND = [
    str(REPO / "configs" / "ddp_config.yaml"),
    *("--gpu-memory", "1GiB", "--max-batch", "8", "--throughput-steps", "0"),
]

HUGE = "99999999999999999999999"
NOT_FINITE = ["inf", "nan", "1e400"]

_FLAGS: dict[tuple[str, str], list[str]] = {
    ("plan", "--gpu-memory"): [*NOT_FINITE, "1e400GB", "-80", "0", "0.1B", "2PiB", "80XB"],
    ("plan", "--overhead"): [*NOT_FINITE, "1e400MiB", "0", "-1", "2PiB"],
    ("plan", "--params"): [*NOT_FINITE, "0", "-5", "1e16", "1e-3"],
    **{
        ("plan", flag): [*NOT_FINITE, "0", "-1", "1.5", str(MAX_DIMENSION + 1), HUGE]
        for flag in ("--layers", "--hidden", "--heads", "--kv-heads", "--seq", "--vocab", "--ffn")
    },
    **{
        ("plan", flag): [*NOT_FINITE, "0", "-1", str(MAX_GPUS + 1), HUGE]
        for flag in ("--gpus", "--gpus-per-node", "--tensor-parallel")
    },
    **{
        ("plan", flag): [*NOT_FINITE, "0", "-1", str(MAX_BATCH + 1), HUGE]
        for flag in ("--global-batch", "--micro-batch", "--base-batch")
    },
    ("plan", "--lr"): [*NOT_FINITE, "0", "-1"],
    ("plan", "--safety-margin"): [*NOT_FINITE, "0", "1.5", "-0.1"],
    ("plan", "--tokens"): [*NOT_FINITE, "0", "-1", "0.5", "1e18", "10X", HUGE],
    ("plan", "--steps"): [*NOT_FINITE, "0", "-1", "1.5", str(MAX_STEPS + 1), HUGE],
    ("plan", "--mfu"): [*NOT_FINITE, "0", "-0.4", "1.5", "40%"],
    ("plan", "--price-per-gpu-hour"): [*NOT_FINITE, "0", "-2.49", "1e5", "$2"],
    **{
        ("plan", flag): [*NOT_FINITE, "0", "-1", "1e6", "1e400GB/s", "400Mb/s", "fast"]
        for flag in ("--intra-node-gbps", "--inter-node-gbps", "--pcie-gbps")
    },
    **{
        ("find-batch", flag): [*NOT_FINITE, "0", "-1", str(MAX_BATCH + 1), HUGE]
        for flag in ("--min-batch", "--max-batch")
    },
    ("find-batch", "--safety-margin"): [*NOT_FINITE, "0", "1.5"],
    ("find-batch", "--gpu-memory"): [*NOT_FINITE, "1e400GB", "0", "-1", "2PiB"],
    ("find-batch", "--gpus"): [*NOT_FINITE, "0", str(MAX_GPUS + 1)],
    ("find-batch", "--throughput-steps"): [*NOT_FINITE, "-1", "10001", HUGE],
    ("find-batch", "--peak-tflops"): [*NOT_FINITE, "0", "-1"],
}
CASES = [(cmd, flag, value) for (cmd, flag), values in _FLAGS.items() for value in values]


def test_the_sweep_covers_every_numeric_flag() -> None:
    """A numeric flag added to plan or find-batch must be added to the table above."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("plan", "find-batch"):
        numeric = {
            flag
            for action in sub.choices[command]._actions
            if action.type is not None
            for flag in action.option_strings
            if flag.startswith("--")
        }
        assert numeric == {f for c, f in _FLAGS if c == command}, command
    assert len(CASES) >= 150


@pytest.mark.parametrize(("command", "flag", "value"), CASES)
def test_bad_number_is_one_line_naming_the_flag(
    command: str,
    flag: str,
    value: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    base = SHAPE if command == "plan" else FIND
    assert main([command, *base, f"{flag}={value}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith(f"gpu-training: error: {command}: argument {flag}: expected")
    assert repr(value) in captured.err  # the value as given, not what it became
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("argv", "attribute", "expected"),
    [
        (["plan", "--gpu-memory", "1PiB"], "gpu_memory", 2**50),
        (["plan", "--gpu-memory", "1e3MiB"], "gpu_memory", 1000 * 2**20),
        (["plan", "--gpu-memory", "1E3MiB"], "gpu_memory", 1000 * 2**20),
        (["plan", "--gpu-memory", "80", "--overhead", "1B"], "overhead", 1),
        (["plan", "--gpu-memory", "80", "--params", "1e15"], "params", 10**15),
        (["plan", "--gpu-memory", "80", "--seq", str(MAX_DIMENSION)], "seq", MAX_DIMENSION),
        (["plan", "--gpu-memory", "80", "--gpus", str(MAX_GPUS)], "gpus", MAX_GPUS),
        (["plan", "--gpu-memory", "80", "--global-batch", "1"], "global_batch", 1),
        (["plan", "--gpu-memory", "80", "--micro-batch", str(MAX_BATCH)], "micro_batch", MAX_BATCH),
        (["plan", "--gpu-memory", "80", "--lr", "1e-300"], "lr", 1e-300),
        (["plan", "--gpu-memory", "80", "--safety-margin", "1"], "safety_margin", 1.0),
        (["plan", "--gpu-memory", "80", "--tokens", "1e17"], "tokens", MAX_TOKENS),
        (["plan", "--gpu-memory", "80", "--steps", str(MAX_STEPS)], "steps", MAX_STEPS),
        (["plan", "--gpu-memory", "80", "--mfu", "1"], "mfu", 1.0),
        (["plan", "--gpu-memory", "80", "--price-per-gpu-hour", "1e4"], "price_per_gpu_hour", 1e4),
        (["plan", "--gpu-memory", "80", "--pcie-gbps", "100TB/s"], "pcie_gbps", MAX_BANDWIDTH),
        (["plan", "--gpu-memory", "80", "--inter-node-gbps", "400Gb/s"], "inter_node_gbps", 50.0),
        (["find-batch", "j.yaml", "--throughput-steps", "0"], "throughput_steps", 0),
        (["find-batch", "j.yaml", "--throughput-steps", "10000"], "throughput_steps", 10000),
        (["find-batch", "j.yaml", "--max-batch", str(MAX_BATCH)], "max_batch", MAX_BATCH),
    ],
)
def test_the_bounds_themselves_are_accepted(
    argv: list[str], attribute: str, expected: float
) -> None:
    assert getattr(build_parser().parse_args(argv), attribute) == expected


def test_a_huge_but_valid_plan_still_answers(capsys: pytest.CaptureFixture[str]) -> None:
    """The bounds are where the estimate still works: the dimensions at their largest (the
    sequence length kept short: the profiler allocates its token ids for real)."""
    top = str(MAX_DIMENSION)
    argv = ["plan", "--layers", top, "--hidden", top, "--seq", "4096", "--vocab", top]
    assert main([*argv, "--ffn", top, "--gpu-memory", "1PiB", "--gpus", "8"]) == 0
    assert "even a per-device batch of 1 does not fit" in capsys.readouterr().out
