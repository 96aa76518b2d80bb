"""``gpu-training lint`` ``GT009``: an FSDP context imported by its name names a sharded model.

Issue 33, a miss of held-back truth set 23 (``benchmarks/lint_heldout23_truth.csv``,
``marcofariasmx/nested_learning`` ``train_fsdp.py:94``): a save helper returns early with
``if not should_save or rank != 0: return``, then takes the full state dict of the FSDP model
under ``state_dict_type(model, StateDictType.FULL_STATE_DICT, ...)``, the name imported from
``torch.distributed.fsdp``: an all-gather rank 0 enters alone, and the job hangs at the first
save. ``FSDP.state_dict_type(model, ...)`` already told the lint that ``model`` is sharded (only
FSDP modules go there); the same context called by its bare name did not. The ``or`` exit was
read right already (the variants with ``FSDP.`` pass before the change too). Minimal
reproductions written here, with the variants that stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType, FullStateDictConfig, state_dict_type


def save_checkpoint(model, optimizer, step, rank, every):
    should_save = (step + 1) % every == 0
    if EXIT:
        return
    with CONTEXT(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig()):
        state = model.state_dict()
    torch.save({"model": state, "optimizer": optimizer.state_dict()}, f"step_{step}.pt")
"""


def _files(exit_test: str, context: str = "state_dict_type") -> dict[str, str]:
    text = _SCRIPT.replace("EXIT", exit_test).replace("CONTEXT", context)
    return {"checkpointing.py": text}


@pytest.mark.parametrize(
    ("exit_test", "context"),
    [
        ("not should_save or rank != 0", "FSDP.state_dict_type"),  # the `or` exit
        ("rank != 0 or not should_save", "FSDP.state_dict_type"),
        ("rank != 0", "state_dict_type"),  # the context imported by its name
        ("not should_save or rank != 0", "state_dict_type"),  # both, as set 23 wrote it
    ],
)
def test_a_gather_after_an_or_exit_of_the_other_ranks_is_rank_0_alone(
    tmp_path: Path, exit_test: str, context: str
) -> None:
    found = repo_findings(tmp_path, _files(exit_test, context), "GT009")
    assert found == [("checkpointing.py", 12)]


@pytest.mark.parametrize("exit_test", ["not should_save", "not should_save or step < 0"])
def test_an_exit_no_rank_decides_leaves_every_rank_there(tmp_path: Path, exit_test: str) -> None:
    assert repo_findings(tmp_path, _files(exit_test), "GT009") == []
