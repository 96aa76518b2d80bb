"""``gpu-training lint`` GT018: a GPU chosen with a library's *global* rank.

``with torch.cuda.device(proc_id):`` where every caller passes ``trainer.args.process_index``
(issue 33, set 19): Accelerate's and Hugging Face's ``process_index`` and Lightning's
``global_rank`` count every process of every node, so on a second node they name a GPU that
does not exist. The minimal reproduction is an Accelerate-style memory report; the variants
pick the GPU with ``set_device``, ``torch.device`` and Fabric's ``global_rank``, and through
``torch.distributed``'s own rank. The local indices (``local_process_index``, ``local_rank``)
and a project's own attribute bound to a local rank stay silent.
"""

from __future__ import annotations

import pytest

from gpu_training.diagnostics.lint.report import lint_source

_ACCELERATE = """\
import json
import torch
from accelerate import Accelerator


def report_memory(run_id, proc_id):
    with torch.cuda.device(proc_id):
        peak = torch.cuda.max_memory_allocated() / 2**30
    with open(f"mem/{{run_id}}_{{proc_id}}.json", "w") as handle:
        json.dump({{"gpu": proc_id, "peak": peak}}, handle)


def main(model, loader, optimizer):
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        accelerator.backward(model(batch).mean())
        optimizer.step()
    report_memory("run", accelerator.{attribute})
"""


def _gt018(source: str) -> list[int]:
    return [f.line for f in lint_source(source) if f.code == "GT018"]


def test_a_memory_report_in_the_gpu_of_the_global_process_index() -> None:
    assert _gt018(_ACCELERATE.format(attribute="process_index")) == [7]


def test_the_local_process_index_is_each_machine_s_gpu() -> None:
    assert _gt018(_ACCELERATE.format(attribute="local_process_index")) == []


@pytest.mark.parametrize(
    ("pick", "line"),
    [
        ("torch.cuda.set_device(fabric.global_rank)", 6),
        ("model = model.to(torch.device('cuda', fabric.global_rank))", 6),
        ("with torch.cuda.device(fabric.global_rank):\n    model = model.cuda()", 6),
    ],
)
def test_fabric_global_rank_as_a_gpu_index(pick: str, line: int) -> None:
    source = (
        "import torch\nfrom lightning.fabric import Fabric\n\n"
        "fabric = Fabric(accelerator='cuda', devices=4, num_nodes=2)\nfabric.launch()\n"
        f"{pick}\nmodel = fabric.setup(model)\n"
    )
    assert _gt018(source) == [line]


def test_the_rank_of_torch_distributed_in_a_device_context() -> None:
    source = """\
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
with torch.cuda.device(rank):
    stats = torch.cuda.memory_stats()
"""
    assert _gt018(source) == [6]


def test_an_attribute_the_project_binds_to_the_local_rank_is_read_through() -> None:
    source = """\
import os
import torch
import torch.distributed as dist


class Runner:
    def __init__(self):
        dist.init_process_group("nccl")
        self.global_rank = int(os.environ["LOCAL_RANK"])

    def pin(self):
        with torch.cuda.device(self.global_rank):
            torch.cuda.empty_cache()
"""
    assert _gt018(source) == []
