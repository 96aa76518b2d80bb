"""docs/huggingface.md runs as written: every ``$ gpu-training ...`` line of its console blocks.

In order, in a scratch directory that sees the repository's ``configs/`` and ``src/`` (the
shipped job files name paths relative to the repository root), so ``runs/`` lands there.
``train`` gets fewer steps (``--set``); everything else runs exactly as printed. Commands that
start no ranks run in this process (``cli.main``); the others as subprocesses. Its Python
blocks run in ``tests/test_docs.py`` like every guide's.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from dist_harness import REPO_ROOT, run_python

pytestmark = [pytest.mark.multirank, pytest.mark.slow, pytest.mark.timeout(400)]

DOC = REPO_ROOT / "docs" / "huggingface.md"
_CONSOLE = re.compile(r"^```console\n(.*?)^```", re.M | re.S)
_SHORT = {
    "training.max_steps": 4,
    "training.warmup_steps": 1,
    "checkpoint.every": 2,
    "run.eval_every": 4,
    "run.log_every": 2,
}


def doc_commands() -> list[list[str]]:
    """The ``$ `` lines of the guide's console blocks, split like a shell would."""
    lines = [ln for block in _CONSOLE.findall(DOC.read_text()) for ln in block.splitlines()]
    return [shlex.split(ln[2:]) for ln in lines if ln.startswith("$ ")]


def test_the_guide_shows_the_whole_walk_through() -> None:
    commands = [" ".join(c[:3]) for c in doc_commands()]
    assert commands.count("gpu-training train configs/hf/pretrain.yaml") == 1
    assert "gpu-training train configs/hf/finetune_fsdp.yaml" in commands
    assert "gpu-training train configs/hf/lora_zero2.yaml" in commands
    assert sum(c.startswith("gpu-training ckpt export-hf") for c in commands) == 3
    assert any(c.startswith("gpu-training plan --hf-config") for c in commands)
    assert any(c.startswith("gpu-training verify --config") for c in commands)


def test_every_command_of_the_guide_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_training.cli import main

    for name in ("configs", "src"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    monkeypatch.chdir(tmp_path)
    for command in doc_commands():
        assert command[0] == "gpu-training", command
        args = command[1:]
        if args[0] in ("train", "verify"):  # they start ranks: a process of their own
            if args[0] == "train":
                args += [x for k, v in _SHORT.items() for x in ("--set", f"{k}={v}")]
            proc = run_python(["-m", "gpu_training", *args], timeout=300, cwd=tmp_path)
            assert proc.returncode == 0, (
                f"{shlex.join(command)}:\n{(proc.stdout + proc.stderr)[-3000:]}"
            )
            if args[0] == "verify":
                assert "all 7 checks passed" in proc.stdout, proc.stdout[-2000:]
            continue
        assert main(args) == 0, shlex.join(command)
        out = capsys.readouterr().out
        if args[0] == "plan":
            assert "LlamaForCausalLM" in out and "recommended:" in out, out
    _check_outputs(tmp_path / "runs")


def _check_outputs(runs: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(runs / "hf_pretrain" / "hf")("And God said")["input_ids"]
    probe = torch.tensor([ids])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(runs / "hf_pretrain" / "hf").eval()
        merged = AutoModelForCausalLM.from_pretrained(runs / "hf_lora" / "merged").eval()
        adapter = PeftModel.from_pretrained(base, runs / "hf_lora" / "adapter").eval()
        torch.testing.assert_close(adapter(probe).logits, merged(probe).logits, atol=1e-5, rtol=0)
    assert (runs / "hf_finetune" / "checkpoints" / "step-00000004" / ".metadata").is_file()
