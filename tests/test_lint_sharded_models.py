"""``gpu-training lint``: an Accelerate script is sharded by the config it is launched with.

An Accelerate script that builds a plain ``Accelerator()`` takes its distributed type from
``accelerate launch --config_file``. When every multi-process Accelerate config of the
repository says ``distributed_type: FSDP``, the prepared model is sharded: its
``save_pretrained()`` (through ``state_dict()``) all-gathers, so calling it on the main
process only hangs (``GT009``), and accumulating without ``accelerator.accumulate()`` is the
FSDP case, not DDP's (no ``GT013``: set 8's convention). Under a DDP config neither holds. Accelerate's
``load_state`` loads per-rank shards under FSDP and DeepSpeed (a collective) and plain files
under DDP (not one). Each repository is a minimal reproduction written here (issue 33, set 10).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_SCRIPT = """\
import os

from accelerate import Accelerator


def main(model, optimizer, loader, steps, tokenizer):
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, batch in enumerate(loader):
        loss = model(**batch).loss / steps
        accelerator.backward(loss)
        if (step + 1) % steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        os.makedirs("out", exist_ok=True)
        unwrapped.save_pretrained("out", save_function=accelerator.save)
"""
_SAVE_LINE = 19
_BACKWARD_LINE = 11

_LOAD = """\
import torch
from accelerate import Accelerator


def evaluate(model, optimizer, loader, path):
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.save_state(path)
    if accelerator.is_main_process:
        accelerator.load_state(path)
        print(model.module.weight.sum().item())
"""


def _config(kind: str) -> str:
    return (
        "compute_environment: LOCAL_MACHINE\n"
        f"distributed_type: {kind}\n"
        "num_machines: 1\nnum_processes: 4\n"
    )


def _repository(tmp_path: Path, script: str, configs: dict[str, str]) -> Path:
    (tmp_path / ".git").mkdir()
    for name, kind in configs.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(_config(kind) if name.endswith((".yaml", ".yml")) else kind)
    (tmp_path / "train.py").write_text(script)
    return tmp_path


def _found(root: Path) -> set[tuple[int, str]]:
    report = lint_paths([root])
    assert not report.errors, report.errors
    return {(f.line, f.code) for f in report.findings if f.code != "GT015"}


@pytest.mark.parametrize(
    "configs",
    [
        {"fsdp.yaml": "FSDP"},
        {"configs/fsdp_multi_gpu.yaml": "FSDP", "configs/single.yaml": "NO"},
        {"accelerate/fsdp2.yml": "'FSDP'"},
    ],
)
def test_an_fsdp_config_makes_the_main_process_save_a_collective(
    tmp_path: Path, configs: dict[str, str]
) -> None:
    found = _found(_repository(tmp_path, _SCRIPT, configs))
    assert (_SAVE_LINE, "GT009") in found
    assert (_BACKWARD_LINE, "GT013") not in found  # FSDP reduce-scatters by design


@pytest.mark.parametrize(
    "configs",
    [{}, {"multi_gpu.yaml": "MULTI_GPU"}, {"fsdp.yaml": "FSDP", "ddp.yaml": "MULTI_GPU"}],
)
def test_a_ddp_or_mixed_config_leaves_the_save_alone(
    tmp_path: Path, configs: dict[str, str]
) -> None:
    found = _found(_repository(tmp_path, _SCRIPT, configs))
    assert (_SAVE_LINE, "GT009") not in found
    assert (_BACKWARD_LINE, "GT013") in found  # DDP: every micro-batch all-reduces


@pytest.mark.parametrize(
    ("configs", "collective"),
    [
        ({}, False),
        ({"multi_gpu.yaml": "MULTI_GPU"}, False),
        ({"zero3.yaml": "DEEPSPEED"}, True),
        ({"fsdp.yaml": "FSDP"}, True),
    ],
)
def test_load_state_is_a_collective_only_when_sharded(
    tmp_path: Path, configs: dict[str, str], collective: bool
) -> None:
    found = _found(_repository(tmp_path, _LOAD, configs))
    assert ((10, "GT009") in found) is collective


def test_a_plugin_in_the_script_decides_without_a_config(tmp_path: Path) -> None:
    script = _LOAD.replace(
        "accelerator = Accelerator()",
        "accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))",
    ).replace(
        "from accelerate import Accelerator", "from accelerate import Accelerator, DeepSpeedPlugin"
    )
    found = _found(_repository(tmp_path, script, {}))
    assert (10, "GT009") in found


_SAVE_STATE = """\
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration


def fit(model, optimizer, loader, out):
    accelerator = Accelerator(project_config=ProjectConfiguration(out, automatic_checkpoint_naming=NAMING))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        accelerator.backward(model(batch).mean())
        optimizer.step()
    if accelerator.is_main_process:
        accelerator.save_state()
"""


@pytest.mark.parametrize(
    ("configs", "naming", "collective"),
    [
        ({}, False, False),  # no config, no sharding named: Accelerate's default launch, DDP
        ({"requirements.txt": "deepspeed>=0.14"}, False, True),  # sharding possible: not known
        ({"README.md": "accelerate launch --use_fsdp train.py"}, False, True),
        ({"run.sh": "accelerate launch --config_file my.yaml train.py"}, False, True),
        ({"multi_gpu.yaml": "MULTI_GPU"}, False, False),  # DDP: each process saves alone
        ({".accelerate/default_config.yaml": "'NO'"}, False, False),
        ({"multi_gpu.yaml": "MULTI_GPU"}, True, True),  # automatic naming: a barrier
        ({"zero2.yaml": "DEEPSPEED"}, False, True),  # the engine's collective save
        ({"fsdp.yaml": "FSDP", "ddp.yaml": "MULTI_GPU"}, False, True),  # either: not known
    ],
)
def test_save_state_is_a_collective_unless_known_ddp_without_automatic_naming(
    tmp_path: Path, configs: dict[str, str], naming: bool, collective: bool
) -> None:
    script = _SAVE_STATE.replace("NAMING", str(naming))
    found = _found(_repository(tmp_path, script, configs))
    assert ((12, "GT009") in found) is collective
