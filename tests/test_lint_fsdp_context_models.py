"""``gpu-training lint``: a helper handed an FSDP model, and the calls of a helper that hangs.

``with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, ...):`` only accepts an
FSDP module, so the ``model`` parameter of a save helper is sharded there even though the
helper never wraps it: its ``state_dict()`` / ``save_pretrained()`` under ``if
dist.get_rank() == 0`` all-gathers on rank 0 alone (``GT009``, issue 33 set 18: a PEFT
adapter saved from an FSDP model). Each call of such a helper from another module, made on
every rank, is where the run stops: reported too. Minimal reproductions written here, in a
few spellings (FSDP class alias, full name, optimizer state, a plain barrier helper).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint import lint_source
from gpu_training.diagnostics.lint.report import lint_paths


def _gt009(source: str) -> list[int]:
    return [f.line for f in lint_source(source) if f.code == "GT009"]


_HELPERS = {
    "peft adapter": """\
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import FullStateDictConfig, StateDictType

def save_adapter(model, out_dir):
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        if dist.get_rank() == 0:
            model.save_pretrained(out_dir)
""",
    "full module path, state_dict": """\
import torch
import torch.distributed
import torch.distributed.fsdp

def export(net, path, rank):
    with torch.distributed.fsdp.FullyShardedDataParallel.state_dict_type(
        net, torch.distributed.fsdp.StateDictType.FULL_STATE_DICT
    ):
        if rank == 0:
            torch.save(net.state_dict(), path)
""",
    "set_state_dict_type then is_main": """\
import torch
from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

def checkpoint(wrapped, path, is_main):
    FullyShardedDataParallel.set_state_dict_type(wrapped, StateDictType.FULL_STATE_DICT)
    if is_main:
        state = wrapped.state_dict()
        torch.save(state, path)
""",
}

_LINES = {
    "peft adapter": [9],
    "full module path, state_dict": [10],
    "set_state_dict_type then is_main": [7],
}


@pytest.mark.parametrize("name", sorted(_HELPERS))
def test_a_model_named_by_an_fsdp_context_is_sharded(name: str) -> None:
    assert _gt009(_HELPERS[name]) == _LINES[name]


def test_the_gather_on_every_rank_is_not_flagged() -> None:
    source = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

def save(model, path):
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        state = model.state_dict()
    if dist.get_rank() == 0:
        torch.save(state, path)
        model.config.save_pretrained(path)
"""
    assert _gt009(source) == []


def test_a_plain_model_elsewhere_in_the_file_is_not_sharded() -> None:
    source = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType

def save(model, path):
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        state = model.state_dict()
    torch.save(state, path)

def export_head(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
"""
    assert _gt009(source) == []


def test_the_call_of_a_helper_that_hangs_is_reported(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "save_utils.py").write_text(_HELPERS["peft adapter"])
    (tmp_path / "train.py").write_text(
        "import torch.distributed as dist\n"
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
        "from save_utils import save_adapter\n\n"
        "def main(model):\n"
        "    dist.init_process_group('nccl')\n"
        "    model = FSDP(model)\n"
        "    for epoch in range(3):\n"
        "        save_adapter(model, f'out/epoch_{epoch}')\n"
        "    if dist.get_rank() == 0:\n"
        "        print('done')\n"
    )
    found = sorted(
        (Path(f.path).name, f.line) for f in lint_paths([tmp_path]).findings if f.code == "GT009"
    )
    assert found == [("save_utils.py", 9), ("train.py", 9)]


def test_a_helper_called_under_a_rank_test_is_left_to_the_caller(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "sync.py").write_text(
        "import torch.distributed as dist\n\n"
        "def wait_for_main(rank):\n    if rank != 0:\n        dist.barrier()\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch.distributed as dist\nfrom sync import wait_for_main\n\n"
        "dist.init_process_group('nccl')\nrank = dist.get_rank()\n"
        "if rank == 0:\n    wait_for_main(rank)\n"
    )
    found = [f for f in lint_paths([tmp_path]).findings if f.code == "GT009"]
    at_call = [f.detail for f in found if Path(f.path).name == "train.py"]
    assert len(at_call) == 1  # the caller's own guarded call, once
    assert "under its rank test" not in at_call[0]
