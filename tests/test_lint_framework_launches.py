"""``gpu-training lint``: the code before a framework starts its processes runs in every one.

Lightning Fabric's default launcher starts the other local ranks as new processes that run
the script from the top, and ``accelerate launch`` starts every process on the whole script:
what a script's ``__main__`` block does before ``main()`` builds the ``Fabric`` or the
``Accelerator`` runs on every rank, as the code before ``init_process_group`` does under
torchrun. A config dumped there is written by every rank (``GT007``; set 21's Fabric scripts
dump their ``config.yaml`` so). A dataset downloaded before ``fabric.launch()`` is the
exception: the launching process downloads it alone, and the ranks it starts afterwards find
the files in place and write nothing (set 21's image-classification script). A ``ddp_spawn``
Fabric starts workers that never run the ``__main__`` block. Minimal reproductions written
here (issue 33).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_FABRIC_MAIN = """\
import argparse
import os

import lightning as L
import torch
import yaml


def main(args):
    fabric = L.Fabric(accelerator="cuda", devices=args.devices, strategy=STRATEGY)
    fabric.launch()
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = fabric.setup(model, optimizer)
    loss = model(torch.randn(2, 4)).sum()
    fabric.backward(loss)
    optimizer.step()
    if fabric.is_global_zero:
        torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    with open(os.path.join(args.out, "config.yaml"), "w") as f:
        yaml.dump(vars(args), f)
    main(args)
"""
_DUMP_LINE = 27

_ACCELERATE_MAIN = """\
import argparse
import json
import os

import torch
from accelerate import Accelerator


def main(args):
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.randn(2, 4)).sum())
    optimizer.step()
    if accelerator.is_main_process:
        accelerator.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    with open(os.path.join(args.out, "args.json"), "w") as f:
        json.dump(vars(args), f)
    main(args)
"""
_ARGS_LINE = 24

_DATASETS = """\
from torchvision import datasets as tv


def get_dataset(root):
    return tv.CIFAR10(root, train=True, download=True)
"""

_CLASSIFY = """\
import argparse

import lightning as L
import torch

from data.vision import get_dataset


def main(args):
    BEFORE
    fabric = L.Fabric(accelerator="cuda", devices=args.devices, strategy="ddp")
    fabric.launch()
    AFTER
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(train, batch_size=8))
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = fabric.setup(model, optimizer)
    for x, y in loader:
        fabric.backward(model(x).sum())
        optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--root", default="data")
    main(parser.parse_args())
"""


@pytest.mark.parametrize("strategy", ['"ddp"', '"fsdp"', "args.strategy"])
def test_a_config_dumped_before_fabric_launches_is_written_by_every_rank(
    tmp_path: Path, strategy: str
) -> None:
    files = {"retrieval.py": _FABRIC_MAIN.replace("STRATEGY", strategy)}
    assert ("retrieval.py", _DUMP_LINE) in repo_findings(tmp_path, files, "GT007")


def test_a_spawning_fabric_runs_the_main_block_once(tmp_path: Path) -> None:
    files = {"retrieval.py": _FABRIC_MAIN.replace("STRATEGY", '"ddp_spawn"')}
    assert ("retrieval.py", _DUMP_LINE) not in repo_findings(tmp_path, files, "GT007")


def test_a_config_dumped_before_the_accelerator_is_written_by_every_rank(tmp_path: Path) -> None:
    files = {"train.py": _ACCELERATE_MAIN}
    assert repo_findings(tmp_path, files, "GT007") == [("train.py", _ARGS_LINE)]


def test_a_dataset_downloaded_before_fabric_launches_is_downloaded_once(tmp_path: Path) -> None:
    script = _CLASSIFY.replace("BEFORE", "train = get_dataset(args.root)").replace("AFTER", "pass")
    files = {"classify.py": script, "data/__init__.py": "", "data/vision.py": _DATASETS}
    assert repo_findings(tmp_path, files, "GT007") == []


def test_a_dataset_downloaded_after_fabric_launches_is_downloaded_by_every_rank(
    tmp_path: Path,
) -> None:
    script = _CLASSIFY.replace("BEFORE", "pass").replace("AFTER", "train = get_dataset(args.root)")
    files = {"classify.py": script, "data/__init__.py": "", "data/vision.py": _DATASETS}
    assert repo_findings(tmp_path, files, "GT007") == [("classify.py", 13), ("vision.py", 5)]


def test_only_the_download_after_fabric_launches_is_reported_at_its_call(tmp_path: Path) -> None:
    script = _CLASSIFY.replace("BEFORE", "train = get_dataset(args.root)").replace(
        "AFTER", "train = get_dataset(args.root)"
    )
    files = {"classify.py": script, "data/__init__.py": "", "data/vision.py": _DATASETS}
    assert repo_findings(tmp_path, files, "GT007") == [("classify.py", 13), ("vision.py", 5)]


def test_a_download_in_the_launching_function_before_launch_is_made_once(tmp_path: Path) -> None:
    script = _CLASSIFY.replace("from data.vision import get_dataset", "import torchvision")
    before = script.replace(
        "BEFORE", "train = torchvision.datasets.MNIST(args.root, download=True)"
    ).replace("AFTER", "pass")
    assert repo_findings(tmp_path, {"classify.py": before}, "GT007") == []
    after = script.replace("BEFORE", "pass").replace(
        "AFTER", "train = torchvision.datasets.MNIST(args.root, download=True)"
    )
    (tmp_path / "b").mkdir()
    assert repo_findings(tmp_path / "b", {"classify.py": after}, "GT007") == [("classify.py", 13)]
