"""``gpu-training lint`` ``GT013``: accumulation under a framework that runs DeepSpeed or FSDP.

``accelerator.backward()`` without ``accelerator.accumulate()`` is ``GT013`` when the
Accelerator wraps the model in DDP: every micro-batch all-reduces. An Accelerator that runs
DeepSpeed (``deepspeed_plugin=DeepSpeedPlugin(gradient_accumulation_steps=k)``, a plugin a
helper builds, or the repository's ``distributed_type: DEEPSPEED`` config) hands the model to
DeepSpeed's engine, which counts micro-batches and reduces at its own boundary: there is no
DDP sync to skip. A Fabric with a DeepSpeed or FSDP strategy likewise. A plain DDP
Accelerator or Fabric keeps the finding. Minimal reproductions written here (issue 33,
set 16: a LoRA finetune under Accelerate with a DeepSpeedPlugin).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_ACCELERATE = """\
import torch
from accelerate import Accelerator, DeepSpeedPlugin

accum = 8
{setup}
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
loader = torch.utils.data.DataLoader(list(range(64)), batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for step, batch in enumerate(loader):
    loss = model(batch).mean() / accum
    accelerator.backward(loss)
    if (step + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
"""

_FABRIC = """\
import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import FSDPStrategy

fabric = Fabric(accelerator="cuda", devices=4, strategy={strategy})
fabric.launch()
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, optimizer = fabric.setup(model, optimizer)
loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(list(range(64)), batch_size=4))
for i, batch in enumerate(loader):
    loss = model(batch).mean() / 4
    fabric.backward(loss)
    if (i + 1) % 4 == 0:
        optimizer.step()
        optimizer.zero_grad()
"""

_ENGINES = {
    "accelerate_plugin": _ACCELERATE.format(
        setup="plugin = DeepSpeedPlugin(gradient_accumulation_steps=accum)\n"
        "accelerator = Accelerator(mixed_precision='bf16', deepspeed_plugin=plugin)"
    ),
    "accelerate_plugin_helper": _ACCELERATE.format(
        setup="def make_plugin(steps):\n"
        "    return DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=steps)\n\n\n"
        "accelerator = Accelerator(deepspeed_plugin=make_plugin(accum))"
    ),
    "fabric_deepspeed": _FABRIC.format(strategy="'deepspeed_stage_2'"),
    "fabric_fsdp_object": _FABRIC.format(strategy="FSDPStrategy(sharding_strategy='FULL_SHARD')"),
}


def _codes(tmp_path: Path, source: str, config: str | None = None) -> set[str]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(source)
    if config is not None:
        (tmp_path / "accelerate_config.yaml").write_text(config)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {f.code for f in report.findings}


@pytest.mark.parametrize("engine", sorted(_ENGINES))
def test_accumulation_under_a_deepspeed_or_fsdp_engine_is_not_gt013(
    tmp_path: Path, engine: str
) -> None:
    assert "GT013" not in _codes(tmp_path, _ENGINES[engine])


def test_a_repository_deepspeed_config_is_not_gt013(tmp_path: Path) -> None:
    source = _ACCELERATE.format(setup="accelerator = Accelerator()")
    config = "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 8\n"
    assert "GT013" not in _codes(tmp_path, source, config)


def test_a_ddp_accelerator_keeps_gt013(tmp_path: Path) -> None:
    source = _ACCELERATE.format(setup="accelerator = Accelerator(mixed_precision='fp16')")
    config = "distributed_type: MULTI_GPU\nnum_processes: 8\n"
    assert "GT013" in _codes(tmp_path, source, config)


def test_a_ddp_fabric_keeps_gt013(tmp_path: Path) -> None:
    assert "GT013" in _codes(tmp_path, _FABRIC.format(strategy="'ddp'"))
