"""``gpu-training lint`` ``GT014``: the trained weights overwritten on rank 0 only, mid-training.

Issue 33, held-back set 24 (``benchmarks/lint_heldout24_truth.csv``, three ``bug`` rows the lint
missed): at each checkpoint, ``if accelerator.is_main_process: ... ema_unet.copy_to(
unet.parameters())`` puts the EMA weights into rank 0's training UNet, and training goes on:
DDP broadcast the weights once, at the wrap, so the replicas differ for the rest of the run. The
same rule then found diffusers' ``research_projects/scheduled_huber_loss_training`` SDXL script
doing it at each epoch's validation with a ``store`` and no ``restore`` (the mainline example
restores). Diffusers' own pattern (store, copy_to, validate, restore) and the copy after the
training loop (saving the EMA weights at the end) are not reported, nor a copy every rank makes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
from accelerate import Accelerator


def main(model, ema, loader, optimizer, epochs):
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        for step, batch in enumerate(loader):
            loss = model(batch).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            ema.step(model.parameters())
INSIDE
OUTSIDE


if __name__ == "__main__":
    main(None, None, None, None, 1)
"""

_AT_CHECKPOINTS = (
    "            if step % 100 == 0 and accelerator.is_main_process:\n"
    "                accelerator.save_state('ckpt')\n"
    "                ema.copy_to(model.parameters())"
)
_AT_VALIDATION = (
    "        if accelerator.is_main_process:\n"
    "            ema.store(model.parameters())\n"
    "            ema.copy_to(model.parameters())\n"
    "            print('validating')"
)
_RESTORED = _AT_VALIDATION + "\n            ema.restore(model.parameters())"
_EVERY_RANK = "        ema.copy_to(model.parameters())"
_AT_THE_END = (
    "    if accelerator.is_main_process:\n"
    "        ema.copy_to(model.parameters())\n"
    "        accelerator.save_state('final')"
)


@pytest.mark.parametrize(
    ("inside", "outside", "reported"),
    [
        (_AT_CHECKPOINTS, "", True),
        (_AT_VALIDATION, "", True),
        (_RESTORED, "", False),
        (_EVERY_RANK, "", False),
        ("", _AT_THE_END, False),
    ],
)
def test_weights_copied_in_on_rank_0_mid_training(
    tmp_path: Path, inside: str, outside: str, reported: bool
) -> None:
    script = _SCRIPT.replace("INSIDE", inside).replace("OUTSIDE", outside)
    lines = script.splitlines()
    copy = next(i + 1 for i, text in enumerate(lines) if "ema.copy_to(" in text)
    found = repo_findings(tmp_path, {"train.py": script}, "GT014")
    assert found == ([("train.py", copy)] if reported else [])
