"""``gpu-training lint``: files a library call writes for its caller (``GT007``).

A dataset told ``download=True`` fetches and extracts its archive into its root when it is
missing: every process of a run that builds it outside a rank-0 guard writes the same files
at once (issue 33, set 18: FashionMNIST at a torchrun script's top level and in an
Accelerate script). ``OmegaConf.save(cfg, path)`` writes its path the way ``torch.save``
does (set 18: a launcher run by ``accelerate launch`` that dumps its config on every
process). Minimal reproductions written here, with DDP, Accelerate, DeepSpeed and Fabric.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint import lint_source
from gpu_training.diagnostics.lint.report import lint_paths


def _gt007(source: str) -> list[int]:
    return [f.line for f in lint_source(source) if f.code == "GT007"]


_DOWNLOADS = {
    "torchrun top level": (
        """\
import os
from torchvision import datasets
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
train = datasets.FashionMNIST(root="data", train=True, download=True)
dist.init_process_group("nccl")
""",
        [6],
    ),
    "accelerate": (
        """\
import torchvision
from accelerate import Accelerator

accelerator = Accelerator()
train_set = torchvision.datasets.CIFAR10("./cifar", train=True, download=True)
""",
        [5],
    ),
    "deepspeed in a function": (
        """\
import deepspeed
from torchvision.datasets import MNIST

def main(args, model):
    engine, *_ = deepspeed.initialize(args=args, model=model)
    ds = MNIST(args.data, train=False,
               download=True)
    return engine, ds
""",
        [6],
    ),
    "fabric": (
        """\
import lightning as L
from torchvision.datasets import CIFAR100

fabric = L.Fabric(devices=4)
fabric.launch()
data = CIFAR100(root=f"{fabric.logger.root_dir}/data", download=True)
""",
        [6],
    ),
}


@pytest.mark.parametrize("name", sorted(_DOWNLOADS))
def test_a_download_on_every_rank_is_a_write(name: str) -> None:
    source, lines = _DOWNLOADS[name]
    assert _gt007(source) == lines


def test_a_download_under_rank0_first_or_turned_off_is_not_flagged() -> None:
    source = """\
import torch.distributed as dist
from torchvision import datasets

dist.init_process_group("nccl")
if dist.get_rank() == 0:
    datasets.MNIST("data", download=True)
dist.barrier()
train = datasets.MNIST("data", download=False)
test = datasets.MNIST("data", train=False, download=dist.get_rank() == 0)
"""
    assert _gt007(source) == []


def test_a_download_message_names_the_dataset() -> None:
    source = _DOWNLOADS["accelerate"][0]
    [finding] = [f for f in lint_source(source) if f.code == "GT007"]
    assert "CIFAR10(download=True)" in finding.detail
    assert "accelerator.save" not in finding.detail


_CONFIG_SAVES = {
    "omegaconf": """\
import os
import torch.distributed as dist
from omegaconf import OmegaConf

def main(cfg):
    dist.init_process_group("nccl")
    os.makedirs(cfg.out, exist_ok=True)
    OmegaConf.save(cfg, os.path.join(cfg.out, "config.yaml"))
""",
    "omegaconf keyword": """\
from accelerate import Accelerator
from omegaconf import OmegaConf as OC

accelerator = Accelerator()
OC.save(config=cfg, f="run/config.yaml")
""",
    "joblib": """\
import joblib
import torch.distributed as dist

dist.init_process_group("nccl")
joblib.dump(stats, "out/stats.pkl")
""",
}


@pytest.mark.parametrize("name", sorted(_CONFIG_SAVES))
def test_a_library_save_of_an_object_to_a_path_is_a_write(name: str) -> None:
    assert len(_gt007(_CONFIG_SAVES[name])) == 1


def test_a_library_save_guarded_or_of_an_instance_is_not_flagged() -> None:
    source = """\
import torch.distributed as dist
from omegaconf import OmegaConf

dist.init_process_group("nccl")
if dist.get_rank() == 0:
    OmegaConf.save(cfg, "run/config.yaml")
writer.save(cfg, "x")
OmegaConf.save(cfg, f"run/config.{dist.get_rank()}.yaml")
"""
    assert _gt007(source) == []


def test_a_download_in_a_helper_module_is_reported_in_it(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "data.py").write_text(
        "from torchvision import datasets\n\n"
        "def build(root):\n"
        "    return datasets.SVHN(root=root, split='train', download=True)\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch.distributed as dist\nfrom data import build\n\n"
        "def main():\n    dist.init_process_group('nccl')\n    ds = build('./svhn')\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    found = {(Path(f.path).name, f.line) for f in lint_paths([tmp_path]).findings}
    assert ("data.py", 4) in found


def test_a_dataset_saved_to_disk_on_every_rank_is_a_write() -> None:
    source = """\
import os
from accelerate import Accelerator

accelerator = Accelerator()
with accelerator.main_process_first():
    tokenized = raw.map(tokenize, batched=True)
tokenized.save_to_disk(os.path.join(out_dir, "tokenized"))
if accelerator.is_main_process:
    tokenized.save_to_disk("copy")
"""
    assert _gt007(source) == [7]
