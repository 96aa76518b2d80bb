"""``gpu-training lint`` ``GT019``: a model class of another file that builds its layers in bf16.

``nn.Linear(d, d, dtype=torch.bfloat16)`` in a module's constructor, directly, through a helper
that returns an ``nn.Sequential`` of such layers, or through a submodule class, makes the
object's parameters bf16 from the start; a ``torch.optim.Adam`` over them keeps bf16 moments
and updates with no fp32 master copy. Minimal reproductions written here (issue 33, set 24: a
long-context compressor trained under DDP with ``torch.optim.Adam``). Not reported: the same
classes built in fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_MODELS = """\
import torch
from torch import nn


def feed_forward(dim):
    return nn.Sequential(
        nn.LayerNorm(dim, dtype={dtype}),
        nn.Linear(dim, 4 * dim, bias=False, dtype={dtype}),
        nn.SiLU(),
    )


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.to_q = nn.Linear(dim, dim, bias=False, dtype={dtype})


class Compressor(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.{part}
"""

_PARTS = {
    "direct": "latent = nn.Parameter(torch.randn(64, dim, dtype={dtype}))",
    "helper": "ff = feed_forward(dim)",
    "submodule": "attn = Attention(dim)",
}

_TRAIN = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from models import Compressor

dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
model = Compressor(4096).cuda(rank)
model = DDP(model, device_ids=[rank])
optimizer = torch.optim.Adam(model.parameters(), lr=5e-5)
for batch in [torch.randn(2, 4096)] * 3:
    model(batch.cuda()).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
"""


def _found(tmp_path: Path, part: str, dtype: str) -> list[tuple[str, int]]:
    models = _MODELS.replace("{part}", _PARTS[part]).replace("{dtype}", dtype)
    return repo_findings(tmp_path, {"models.py": models, "train.py": _TRAIN}, "GT019")


@pytest.mark.parametrize("part", sorted(_PARTS))
def test_layers_built_in_bf16_are_bf16_parameters(tmp_path: Path, part: str) -> None:
    assert _found(tmp_path, part, "torch.bfloat16") == [("train.py", 14)]


@pytest.mark.parametrize("part", sorted(_PARTS))
def test_layers_built_in_fp32_are_not(tmp_path: Path, part: str) -> None:
    assert _found(tmp_path, part, "torch.float32") == []
