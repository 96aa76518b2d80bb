"""``gpu-training lint`` ``GT009``: a helper handed the FSDP model gathers it (round 27).

Issue 33, a miss of truth set 11 (``benchmarks/lint_heldout11_truth.csv``): a script wraps its
model in ``FSDP(...)`` (full state dicts by default) and saves it through a helper,

    def save_checkpoint(model, optimizer, path):
        if dist.get_rank() != 0:
            return
        torch.save({"model": model.state_dict(), ...}, path)

called on rank 0 only. ``model.state_dict()`` of a ``FullyShardedDataParallel`` all-gathers the
shards: rank 0 waits for ranks that have returned, and the job hangs at the first checkpoint.
The lint knew a sharded model by its binding in the same function, not through a parameter.
Now a parameter every call of which in the file passes a sharded model is one. Minimal
reproductions written here, with the variants that stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import os
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def save_checkpoint(model, optimizer, epoch, path):
    if dist.get_rank() != 0:
        return
    state = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, path)


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = WRAP
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 2).cuda()).sum().backward()
        optimizer.step()
        CALL
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def _script(wrap: str, call: str) -> dict[str, str]:
    return {"train.py": _SCRIPT.replace("WRAP", wrap).replace("CALL", call)}


_FSDP = "FSDP(torch.nn.Linear(2, 2).cuda())"
_SAVE = 'save_checkpoint(model, optimizer, epoch, "ckpt.pt")'


def test_the_helpers_state_dict_of_the_passed_fsdp_model_is_a_collective(tmp_path: Path) -> None:
    # every rank calls the helper; its own early return leaves the gather to rank 0
    assert repo_findings(tmp_path, _script(_FSDP, _SAVE), "GT009") == [("train.py", 10)]


def test_the_call_under_a_rank_test_is_reported_too(tmp_path: Path) -> None:
    call = f"if dist.get_rank() == 0:\n            {_SAVE}"
    found = repo_findings(tmp_path, _script(_FSDP, call), "GT009")
    assert found == [("train.py", 10), ("train.py", 24)]


@pytest.mark.parametrize(
    ("wrap", "call"),
    [
        ("torch.nn.Linear(2, 2).cuda()", _SAVE),  # a plain model: rank 0 saves alone, fine
        # one caller passes something else: the parameter is not known to be sharded
        (_FSDP, f'{_SAVE}\n        save_checkpoint(model.module, optimizer, epoch, "b.pt")'),
    ],
    ids=["plain-model", "mixed-callers"],
)
def test_a_parameter_not_always_sharded_is_not_reported(
    tmp_path: Path, wrap: str, call: str
) -> None:
    assert repo_findings(tmp_path, _script(wrap, call), "GT009") == []
