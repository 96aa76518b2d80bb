"""``gpu-training lint`` ``GT013``: accumulation counted by a counter the step resets.

``count += 1`` every micro-batch and ``if count == 8: optimizer.step(); count = 0`` is the
same window as ``if (i + 1) % 8 == 0:``: the DDP model's every ``backward()`` all-reduces
unless the non-final micro-batches run under ``no_sync()``. A counter compared once (a
warm-up switch), never reset, or compared with 1 is no window. Minimal reproductions written
here (issue 33, set 24: a long-context LLM trained on 8 GPUs accumulating 8 segments).
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
from torch.utils.data.distributed import DistributedSampler

UPDATE_STEP = 8
dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
model = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[rank])
optimizer = torch.optim.Adam(model.parameters())
data = list(range(64))
sampler = DistributedSampler(data)
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
REAL_STEP = 0
for epoch in range(3):
    sampler.set_epoch(epoch)
    for batch in loader:
        loss = model(batch.cuda()).sum() / UPDATE_STEP
        loss.backward()
        REAL_STEP = REAL_STEP + 1
        if REAL_STEP == {limit}:
            optimizer.step()
            optimizer.zero_grad()
            {reset}
dist.destroy_process_group()
"""


def _codes(tmp_path: Path, source: str) -> set[str]:
    (tmp_path / "train.py").write_text(source)
    report = lint_paths([tmp_path / "train.py"])
    assert not report.errors, report.errors
    return {f.code for f in report.findings}


@pytest.mark.parametrize("limit", ["8", "UPDATE_STEP"])
def test_a_reset_counter_is_an_accumulation_window(tmp_path: Path, limit: str) -> None:
    source = _SCRIPT.replace("{limit}", limit).replace("{reset}", "REAL_STEP = 0")
    assert "GT013" in _codes(tmp_path, source)


def test_an_augmented_counter_and_no_sync_is_correct(tmp_path: Path) -> None:
    source = (
        _SCRIPT.replace("{limit}", "UPDATE_STEP")
        .replace("{reset}", "REAL_STEP = 0")
        .replace("REAL_STEP = REAL_STEP + 1", "REAL_STEP += 1")
        .replace(
            "        loss = model(batch.cuda()).sum() / UPDATE_STEP\n        loss.backward()\n",
            "        with model.no_sync() if REAL_STEP + 1 < UPDATE_STEP else nullcontext():\n"
            "            loss = model(batch.cuda()).sum() / UPDATE_STEP\n"
            "            loss.backward()\n",
        )
        .replace("import os\n", "import os\nfrom contextlib import nullcontext\n")
    )
    assert "GT013" not in _codes(tmp_path, source)


@pytest.mark.parametrize(
    ("limit", "reset"),
    [("8", "print('eight steps')"), ("1", "REAL_STEP = 0")],
    ids=["never_reset", "every_step"],
)
def test_a_counter_that_is_no_window(tmp_path: Path, limit: str, reset: str) -> None:
    source = _SCRIPT.replace("{limit}", limit).replace("{reset}", reset)
    assert "GT013" not in _codes(tmp_path, source)
