"""``gpu-training lint`` ``GT019``: bf16 parameters added to the optimizer's list with ``+=``.

``trainable = list(filter(lambda p: p.requires_grad, model.parameters()))`` then
``trainable += list(decoder.parameters())`` with ``decoder.to(torch.bfloat16)`` earlier, and
``torch.optim.AdamW(trainable)``: the decoder's bf16 parameters are stepped with no fp32
master copy. The list is read through what ``+=`` adds to it, not only through its first
binding. Minimal reproductions written here (issue 33, set 25: a mask-conditioned image
generator fine-tuned with LoRA on 8 GPUs). A decoder kept in fp32 is no finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_SCRIPT = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
model = torch.nn.Linear(8, 8).cuda()
decoder = torch.nn.Linear(8, 8).cuda()
decoder.to({dtype})
trainable = list(filter(lambda p: p.requires_grad, model.parameters()))
trainable += list(decoder.parameters())
opt = torch.optim.AdamW(trainable, lr=1e-4)
model = DDP(model, device_ids=[rank])
decoder = DDP(decoder, device_ids=[rank])
for batch in [torch.randn(2, 8)] * 4:
    decoder(model(batch.cuda())).float().sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.parametrize(("dtype", "lines"), [("torch.bfloat16", [15]), ("torch.float32", [])])
def test_parameters_added_with_plus_equals_are_read(
    tmp_path: Path, dtype: str, lines: list[int]
) -> None:
    (tmp_path / "train.py").write_text(_SCRIPT.replace("{dtype}", dtype))
    report = lint_paths([tmp_path / "train.py"])
    assert not report.errors, report.errors
    assert [f.line for f in report.findings if f.code == "GT019"] == lines
