"""``gpu-training lint`` ``GT007``: ``wandb.restore`` downloads a file on every process.

Issue 33, a miss of held-back truth set 20 (``benchmarks/lint_heldout20_truth.csv``,
``apapiu/transformer_latent_diffusion`` ``tld/train.py:94``): an Accelerate training script
resumes with ``wandb.restore(name, run_path=..., replace=True)`` and then ``torch.load(name)``,
with no main-process test. ``wandb.restore`` fetches the run's file into the working directory
(always, with ``replace=True``; when it is missing, without): every process the launcher starts
writes the same file at once, as a dataset's ``download=True`` does. Minimal reproductions
written here, with the variants that stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import wandb
from accelerate import Accelerator


def main(model_name, run_id):
    accelerator = Accelerator()
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
RESTORE
    state = torch.load(model_name, weights_only=True)
    model.load_state_dict(state["model"])
    model, optimizer = accelerator.prepare(model, optimizer)


if __name__ == "__main__":
    main("model.pt", "abc")
"""

_RESTORE = '    wandb.restore(model_name, run_path=f"me/project/runs/{run_id}", replace=True)\n'


def test_a_restore_every_process_runs_is_every_ranks_write(tmp_path: Path) -> None:
    files = {"train.py": _SCRIPT.replace("RESTORE\n", _RESTORE)}
    assert repo_findings(tmp_path, files, "GT007") == [("train.py", 10)]


@pytest.mark.parametrize(
    "restore",
    [
        "    if accelerator.is_main_process:\n    "
        + _RESTORE
        + "    accelerator.wait_for_everyone()\n",
        _RESTORE.replace("model_name,", 'f"{accelerator.process_index}_{model_name}",'),
    ],
    ids=["main-process-only", "one-file-per-rank"],
)
def test_a_restore_one_process_makes_is_not_reported(tmp_path: Path, restore: str) -> None:
    files = {"train.py": _SCRIPT.replace("RESTORE\n", restore)}
    assert repo_findings(tmp_path, files, "GT007") == []
