"""``gpu-training lint``: a rank variable holds what it is bound to, whatever it is called.

``local_rank = dist.get_rank()`` holds the *global* rank, so ``if local_rank == 0:`` is a global
rank-0 guard: one writer in all, neither ``GT017`` (one writer per node) nor ``GT007``. The
reverse, ``rank = int(os.environ["LOCAL_RANK"])``, is node-local whatever its name. Where the
value is unknown (a parameter, an argparse field) the name is read as before. A call
``gpc.get_local_rank(ParallelMode.DATA)`` (Colossal-AI) is the rank within the data-parallel
group, which spans the nodes: not the rank on the node. Issue 33, set 16 (a ``local_rank =
dist.get_rank()`` guarding a source snapshot) and diffusers' Colossal-AI example. Minimal
reproductions written here, with variants (DDP, Accelerate, DeepSpeed, a ``RANK``-environment
attribute).
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths

_MAIN = '\n\nif __name__ == "__main__":\n    main(None, None)\n'

_DDP_SNAPSHOT = """\
import shutil
import torch
import torch.distributed as dist


def main(args, model):
    dist.init_process_group("nccl")
    local_rank = dist.get_rank()
    torch.cuda.set_device(local_rank)
    if local_rank == 0:
        shutil.copy2("train.py", args.out)
        shutil.copytree("models", args.out + "/models")
"""

_ACCELERATE_ATTR = """\
import torch
from accelerate import Accelerator


class Trainer:
    def __init__(self, model):
        self.accelerator = Accelerator()
        self.model = self.accelerator.prepare(model)
        self.local_rank = self.accelerator.process_index

    def save(self, path):
        if self.local_rank == 0:
            torch.save(self.model.state_dict(), path)


def main(args, model):
    Trainer(model).save(args.out)
"""

_ENV_RANK = """\
import json
import os
import deepspeed


def main(args, model):
    deepspeed.init_distributed()
    node_local_rank = int(os.environ.get("RANK", "0"))
    engine, _, _, _ = deepspeed.initialize(model=model, config=args.ds_config)
    if node_local_rank == 0:
        with open(args.out + "/metrics.json", "w") as f:
            json.dump({"loss": 0.0}, f)
"""

_THROUGH_NAME = """\
import torch
import torch.distributed as dist


def main(args, model):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = rank
    if local_rank == 0:
        torch.save(model.state_dict(), args.out)
"""

_COLOSSAL = """\
import os
import torch
import colossalai
from colossalai.context import ParallelMode
from colossalai.core import global_context as gpc


def main(args, model):
    colossalai.launch_from_torch(config={})
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if gpc.get_local_rank(ParallelMode.DATA) == 0:
        torch.save(model.state_dict(), args.out)
    local_rank = gpc.get_local_rank(parallel_mode=ParallelMode.DATA)
    if local_rank == 0:
        torch.save(model.state_dict(), args.out + ".2")
"""

_NODE_LOCAL = """\
import os
import torch
import torch.distributed as dist


def main(args, model):
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    if rank == 0:
        torch.save(model.state_dict(), args.out)
    local_rank = args.local_rank
    if local_rank == 0:
        torch.save(model.state_dict(), args.out + ".2")
    local_rank = dist.get_rank() % torch.cuda.device_count()
    if local_rank == 0:
        torch.save(model.state_dict(), args.out + ".3")
"""


def _codes(tmp_path: Path, source: str) -> list[tuple[int, str]]:
    path = tmp_path / "train.py"
    path.write_text(source + _MAIN)
    found = lint_paths([path]).findings
    return sorted((f.line, f.code) for f in found if f.code in {"GT007", "GT017"})


def test_local_rank_bound_to_the_global_rank_is_a_global_guard(tmp_path: Path) -> None:
    """The set-16 case: ``local_rank = dist.get_rank()`` guarding a source snapshot."""
    assert _codes(tmp_path, _DDP_SNAPSHOT) == []


def test_an_attribute_bound_to_accelerate_process_index_is_global(tmp_path: Path) -> None:
    assert _codes(tmp_path, _ACCELERATE_ATTR) == []


def test_a_local_name_bound_to_the_rank_environment_variable_is_global(tmp_path: Path) -> None:
    assert _codes(tmp_path, _ENV_RANK) == []


def test_a_local_name_bound_through_another_variable_is_global(tmp_path: Path) -> None:
    assert _codes(tmp_path, _THROUGH_NAME) == []


def test_a_group_rank_is_not_the_rank_on_the_node(tmp_path: Path) -> None:
    """``gpc.get_local_rank(ParallelMode.DATA)``: the data-parallel group spans the nodes."""
    assert _codes(tmp_path, _COLOSSAL) == []


def test_node_local_values_and_unknown_values_stay_node_local(tmp_path: Path) -> None:
    """LOCAL_RANK under the name ``rank``, an argparse field, a global rank modulo the GPUs."""
    assert _codes(tmp_path, _NODE_LOCAL) == [(10, "GT017"), (13, "GT017"), (16, "GT017")]
