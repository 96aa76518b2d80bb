"""``gpu-training lint``: nothing after a statement that certainly raises ``NameError`` runs.

A draft DeepSpeed script (issue 33, set 19) ends with ``save_dir = f"...{global_step}"`` and
``model_engine.save_pretrained(save_dir)`` where neither ``global_step`` nor ``model_engine``
is bound anywhere in the module: the first raises ``NameError`` every time, so no process
writes there (no ``GT007``). The variants read an unbound name in a DDP checkpoint helper, an
Accelerate script's main and a Fabric loop; the same code with the name bound, a name bound
only in another function, a lambda or a branch that may not evaluate it, a module with a
star import, and a snippet (no command line of its own, no entry block: its context binds its
free names) still report.
"""

from __future__ import annotations

import pytest

from gpu_training.diagnostics.lint.report import lint_source

_ENTRY = """
if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir")
    main(parser.parse_args(), None, None)
"""

_DEEPSPEED_DRAFT = """\
import argparse
import os
from shutil import copy

import deepspeed


def main(args, model, params):
    model, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=params)
    for batch in args.batches:
        loss = model(batch)
        model.backward(loss)
        model.step()
    if args.output_dir is not None:
        {bind}save_dir = os.path.join(args.output_dir, f"global_step-{{global_step}}")
        model_engine.save_pretrained(save_dir)
        copy(os.path.join(args.model_dir, "tokenizer.json"), save_dir)
"""


def _gt007(source: str) -> list[int]:
    return sorted(f.line for f in lint_source(source) if f.code == "GT007")


def test_a_draft_whose_save_reads_unbound_names_writes_nothing() -> None:
    assert _gt007(_DEEPSPEED_DRAFT.format(bind="") + _ENTRY) == []


def test_the_same_save_with_its_names_bound_reports() -> None:
    bound = "global_step, model_engine = 10, model\n        "
    assert _gt007(_DEEPSPEED_DRAFT.format(bind=bound) + _ENTRY) == [17, 18]


def test_an_unbound_function_called_by_name_is_a_stand_in() -> None:
    """``Net()``, ``build_loader(cfg)``: a program showing a pattern stands in for its parts."""
    draft = _DEEPSPEED_DRAFT.format(bind="").replace("model_engine.", "build_engine(model).")
    draft = draft.replace("{global_step}", "{args.step}")
    assert _gt007(draft + _ENTRY) == [16, 17]


def test_a_snippet_without_its_own_command_line_is_not_judged() -> None:
    """A guide's excerpt reads names its context binds: nothing is dead there."""
    assert _gt007(_DEEPSPEED_DRAFT.format(bind="")) == [16, 17]


_DDP = """\
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def save(model, path):
    {head}
    torch.save(model.module.state_dict(), path)


def main(args, model, _):
    dist.init_process_group("nccl")
    model = DDP(model.cuda())
    save(model, args.output_dir)
    dist.destroy_process_group()
"""


@pytest.mark.parametrize(
    "head",
    [
        "print(f'saving epoch {epoch}')",  # never bound in the module
        "path = os.path.join(path, 'last.pt')",  # `os` never imported
        "if best_metric > 0.5:\n        pass",  # an if's test is always evaluated
    ],
)
def test_a_ddp_helper_after_an_unbound_read_writes_nothing(head: str) -> None:
    assert _gt007(_DDP.format(head=head) + _ENTRY) == []


@pytest.mark.parametrize(
    "head",
    [
        "epoch = 3",
        "log = lambda: print(epoch)",  # the lambda's body is not evaluated here
        "flag = path or epoch",  # the right of `or` may not be evaluated
        "msg = str(epoch) if path is None else path",  # nor a conditional branch
        "def later():\n        return epoch",
    ],
)
def test_names_bound_or_not_certainly_read_keep_the_finding(head: str) -> None:
    assert _gt007(_DDP.format(head=head) + _ENTRY) == [10 + head.count("\n")]


def test_a_name_bound_only_in_another_function_is_not_judged() -> None:
    other = "\n\ndef other():\n    epoch = 1\n    return epoch\n"
    assert _gt007(_DDP.format(head="print(epoch)") + other + _ENTRY) == [10]


def test_a_star_import_may_bind_anything() -> None:
    source = "from config import *\n" + _DDP.format(head="print(epoch)") + _ENTRY
    assert _gt007(source) == [11]


_ACCELERATE = """\
import argparse
import json

from accelerate import Accelerator


def main(args, model, loader):
    accelerator = Accelerator()
    model, loader = accelerator.prepare(model, loader)
    {evaluate}metrics = {{"loss": float(last_loss)}}
    with open(f"{{args.output_dir}}/metrics.json", "w") as handle:
        json.dump(metrics, handle)
"""


def test_accelerate_metrics_dump_after_an_unbound_value_writes_nothing() -> None:
    assert _gt007(_ACCELERATE.format(evaluate="") + _ENTRY) == []
    defined = "last_loss = 0.0\n    "
    assert _gt007(_ACCELERATE.format(evaluate=defined) + _ENTRY) == [12]


def test_fabric_loop_after_the_unbound_read_only_its_block_is_dead() -> None:
    source = """\
import argparse

import torch
from lightning.fabric import Fabric


def main(args, model, _):
    fabric = Fabric(devices=2)
    fabric.launch()
    model = fabric.setup(model)
    for epoch in range(3):
        if epoch == 2:
            torch.save(model.state_dict(), f"{run_dir}/last.pt")
            torch.save(model.state_dict(), "last.pt")
        torch.save(model.state_dict(), "every_epoch.pt")
"""
    assert _gt007(source + _ENTRY) == [15]
