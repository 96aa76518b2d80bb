"""Tests for the ``gpu-training`` command line (skeleton: ``config check`` and ``launch-cmd``)."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from pathlib import Path

import pytest

import gpu_training
from dist_harness import run_python
from gpu_training.cli import build_parser, main
from gpu_training.commands import launch as launch_command

_GOOD_YAML = """\
per_device_batch_size: 8
gradient_accumulation_steps: 4
world_size: 2
learning_rate: 0.001
base_batch_size: 64
"""


def _gt(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m gpu_training ARGV`` in a fresh interpreter (src/ on PYTHONPATH)."""
    return run_python(["-m", "gpu_training", *argv], timeout=60, cwd=cwd)


@pytest.fixture
def good_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "good.yaml"
    path.write_text(_GOOD_YAML)
    return path


def _assert_one_error_line(stderr: str, *needles: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{stderr}"
    assert lines[0].startswith("gpu-training: error: "), lines[0]
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


# --- the command itself -----------------------------------------------------------------------


def test_version_subprocess() -> None:
    proc = _gt("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"gpu-training {gpu_training.__version__}\n"


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (("lint", "--explain", "GT019"), 141),
        (("lint", "--list-rules"), 141),
        (("--help",), 0),  # argparse drops a message it cannot write, and exits 0
    ],
)
def test_a_reader_that_left_ends_the_command_quietly(argv: tuple[str, ...], code: int) -> None:
    # `gpu-training lint --explain GT019 | head -3`: head exits, the next write meets a closed
    # pipe; a BrokenPipeError traceback went to the terminal
    import os
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpu_training", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert proc.stderr == ""
    assert proc.returncode == code  # 141: SIGPIPE's code, as a shell reports `cat`'s


def test_help_lists_subcommands() -> None:
    proc = _gt("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: gpu-training")
    for name in ("train", "config", "launch-cmd", "ckpt"):
        assert re.search(rf"^\s+{re.escape(name)}\b", proc.stdout, re.M), proc.stdout


def _imported_modules(stderr: str) -> set[str]:
    # `-X importtime` lines: "import time: self [us] | cumulative | <indent>package"
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["config", "check", "--help"],
        ["config", "check", "good.yaml", "--set", "world_size=4"],
        ["launch-cmd", "--nproc", "8", "--nnodes", "2", "--rdzv-endpoint", "h:29500", "t.py"],
    ],
)
def test_cli_does_not_import_torch(argv: list[str], good_yaml: Path) -> None:
    proc = run_python(
        ["-X", "importtime", "-m", "gpu_training", *argv], timeout=60, cwd=good_yaml.parent
    )
    assert proc.returncode == 0, proc.stderr
    modules = _imported_modules(proc.stderr)
    assert "gpu_training.cli" in modules  # the probe works: importtime output was parsed
    torch_like = sorted(m for m in modules if m == "torch" or m.startswith("torch."))
    assert not torch_like, f"torch imported by {argv}: {torch_like[:5]}"


def test_no_command_is_a_usage_error() -> None:
    proc = _gt()
    assert proc.returncode == 2
    _assert_one_error_line(proc.stderr, "no command")


def test_main_returns_int_for_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "launch-cmd" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gpu-training {gpu_training.__version__}"


def test_subcommand_surface() -> None:
    """Freezes the registered subcommands; each has a runner and a working --help."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {
        "train",
        "config",
        "launch-cmd",
        "ckpt",
        "launch",
        "plan",
        "find-batch",
        "monitor",
        "report",
        "watch",
        "lint",
        "verify",
        "doctor",
    }
    for name, subparser in sub.choices.items():  # every one runs something, --help works
        assert callable(subparser.get_default("_run")) or subparser._subparsers is not None, name
        with pytest.raises(SystemExit) as exit_info:
            subparser.parse_args(["--help"])
        assert exit_info.value.code == 0, name


@pytest.mark.parametrize(
    "argv",
    [["bogus"], ["config"], ["config", "check"], ["launch-cmd", "t.py"], ["--nope"]],
)
def test_argparse_errors_are_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    _assert_one_error_line(captured.err)


def test_unexpected_exceptions_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(args: argparse.Namespace) -> int:
        raise RuntimeError("a bug, not bad input")

    monkeypatch.setattr(launch_command, "_run_launch_cmd", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["launch-cmd", "--nproc", "2", "t.py"])


# --- config check -----------------------------------------------------------------------------


def test_config_check_prints_effective_batch(good_yaml: Path) -> None:
    proc = _gt("config", "check", str(good_yaml))
    assert proc.returncode == 0, proc.stderr
    assert "effective batch: 64 = 8 per device x 4 accumulation x 2 ranks" in proc.stdout
    assert "WARNING" not in proc.stdout  # 64 is the tuned batch
    assert proc.stderr == ""


def test_config_check_set_and_num_samples(
    good_yaml: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["config", "check", str(good_yaml), "--set", "world_size=4", "--num-samples", "1000"]
    assert main([*argv, "--set", "learning_rate=2e-3", "--set", "max_steps=null"]) == 0
    out = capsys.readouterr().out
    assert "effective batch: 128 = 8 per device x 4 accumulation x 4 ranks" in out
    assert "optimizer steps per epoch: 7 (1000 samples, 104 dropped)" in out
    # 2e-3 is a float (YAML 1.1 would read it as a string), scaled linearly 64 -> 128.
    assert "learning rate: 0.004 (linear scaling from 0.002 at batch 64)" in out
    assert "WARNING: effective batch 128 is 2x the tuned batch 64" in out


def test_config_check_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cfg.json"
    path.write_text('{"per_device_batch_size": 16, "world_size": 2}')
    assert main(["config", "check", str(path)]) == 0
    assert (
        "effective batch: 32 = 16 per device x 1 accumulation x 2 ranks" in capsys.readouterr().out
    )


# Each: (file name, file text or None for a missing file, extra argv, strings the error names)
_BAD_CONFIGS = [
    (
        "wrongtype.yaml",
        'per_device_batch_size: "8"\n',
        [],
        ["wrongtype.yaml", "per_device_batch_size"],
    ),
    (
        "negative.yaml",
        "per_device_batch_size: -4\n",
        [],
        ["negative.yaml", "per_device_batch_size"],
    ),
    ("precision.yaml", "precision: fp8\n", [], ["precision.yaml", "precision", "bf16"]),
    ("typo.yaml", "wrld_size: 2\n", [], ["typo.yaml", "wrld_size", "did you mean 'world_size'"]),
    ("missing.yaml", None, [], ["missing.yaml", "no such config file"]),
    ("syntax.yaml", "a: [1, 2\nb: 3\n", [], ["syntax.yaml", "not valid YAML"]),
    ("syntax.json", '{"world_size": 2,}', [], ["syntax.json", "not valid JSON"]),
    ("binary.yaml", b"\xff\xfe\x00garbage", [], ["binary.yaml", "cannot read"]),
    (
        "set1.yaml",
        "",
        ["--set", "wrld_size=4"],
        ["set1.yaml", "--set", "did you mean 'world_size'"],
    ),
    ("set2.yaml", "", ["--set", "world_size"], ["--set", "world_size", "key=value"]),
    ("set3.yaml", "", ["--set", "world_size=[1"], ["--set", "world_size", "not valid YAML"]),
    ("set4.yaml", "", ["--set", "world_size=four"], ["set4.yaml", "world_size", "'four'"]),
    ("set5.yaml", "", ["--set", "precision=fp8"], ["set5.yaml", "precision"]),
    ("n.yaml", "", ["--num-samples", "-3"], ["--num-samples"]),
]


def _write_bad(tmp_path: Path, name: str, text: str | bytes | None) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "text", "extra", "needles"), _BAD_CONFIGS, ids=[c[0] for c in _BAD_CONFIGS]
)
def test_bad_config_input_subprocess(
    tmp_path: Path, name: str, text: str | bytes | None, extra: list[str], needles: list[str]
) -> None:
    path = _write_bad(tmp_path, name, text)
    proc = _gt("config", "check", str(path), *extra)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    _assert_one_error_line(proc.stderr, *needles)


@pytest.mark.parametrize(
    ("name", "text", "extra", "needles"), _BAD_CONFIGS, ids=[c[0] for c in _BAD_CONFIGS]
)
def test_bad_config_input_in_process(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    text: str | bytes | None,
    extra: list[str],
    needles: list[str],
) -> None:
    path = _write_bad(tmp_path, name, text)
    assert main(["config", "check", str(path), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    _assert_one_error_line(captured.err, *needles)


# --- launch-cmd -------------------------------------------------------------------------------


def test_launch_cmd_single_node(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["launch-cmd", "--nproc", "4", "examples/train_ddp.py", "--epochs", "3"]
    assert main(argv) == 0
    assert capsys.readouterr().out == (
        "torchrun --standalone --nproc_per_node=4 examples/train_ddp.py --epochs 3\n"
    )


def test_launch_cmd_passes_script_flags_through(capsys: pytest.CaptureFixture[str]) -> None:
    # Flags after SCRIPT belong to the script, even ones that look like launch-cmd's own.
    assert main(["launch-cmd", "--nproc", "2", "t.py", "--nproc", "9", "--name", "my run"]) == 0
    out = capsys.readouterr().out.strip()
    assert shlex.split(out)[-5:] == ["t.py", "--nproc", "9", "--name", "my run"]
    assert "--nproc_per_node=2" in out


def test_launch_cmd_multi_node(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["launch-cmd", "--nproc", "8", "--nnodes", "2", "--rdzv-endpoint", "head-node:29500"]
    assert main([*argv, "--rdzv-id", "job7", "train.py", "--lr", "0.1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# node 0:" and lines[2] == "# node 1:"
    assert (
        lines[1]
        == lines[3]
        == (
            "torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d "
            "--rdzv_endpoint=head-node:29500 --rdzv_id=job7 train.py --lr 0.1"
        )
    )
    assert len(lines) == 4


def test_launch_cmd_max_restarts_exports_restart_env(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["launch-cmd", "--nproc", "8", "--nnodes", "2", "--rdzv-endpoint", "h:29500"]
    assert main([*argv, "--max-restarts", "3", "train.py"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    commands = [line for line in lines if line.startswith("torchrun")]
    assert len(commands) == 2 and commands[0] == commands[1]
    assert "--max_restarts=3" in commands[0] and "--rdzv_id=gt-" in commands[0]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--nproc", "8", "--nnodes", "2", "t.py"], "--rdzv-endpoint"),
        (["--nproc", "2", "--rdzv-id", "x", "t.py"], "--rdzv-endpoint"),
        (["--nproc", "2", "--rdzv-endpoint", "h:0", "t.py"], "--rdzv-endpoint"),
        (["--nproc", "2", "--rdzv-endpoint", "::1:29500", "t.py"], "[::1]:29500"),
        (["--nproc", "2", "--rdzv-endpoint", "h:1", "--rdzv-id", "a b", "t.py"], "--rdzv-id"),
        (["--nproc", "0", "t.py"], "--nproc"),
        (["--nproc", "two", "t.py"], "--nproc"),
        (["--nproc", "2", "--max-restarts", "-1", "t.py"], "--max-restarts"),
        (["--nproc", "2", ""], "SCRIPT"),
        (["t.py"], "--nproc"),
    ],
)
def test_launch_cmd_bad_input(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["launch-cmd", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    _assert_one_error_line(captured.err, needle)


def test_launch_cmd_bad_input_subprocess() -> None:
    proc = _gt("launch-cmd", "--nproc", "8", "--nnodes", "2", "--rdzv-endpoint", "h:99999", "t.py")
    assert proc.returncode == 2
    _assert_one_error_line(proc.stderr, "--rdzv-endpoint", "65535")
