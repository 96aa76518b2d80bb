"""``gpu-training lint`` ``GT003``: a loader built in a method of a class that nothing names
never runs.

Issue 33, set 18: ``data_loader.py`` keeps several data modules; the distributed script uses
two of them, and ``CocoDataModule.train_dataloader`` (a ``DataLoader`` with no sampler) belongs
to a class no module names, imports or spells in a string, and no config file of the
repository names: no object of it is ever made, so its loader is never built. Other modules
call ``train_dataloader()`` on other classes' objects, so the method's name alone does not
tell. Minimal reproductions written here, with variants; still reported: the same class made
by the script, or named only as a Hydra ``_target_`` in a YAML config.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_DATA = """\
from torch.utils.data import DataLoader, DistributedSampler


class VideoModule:
    def __init__(self, dataset, batch_size):
        self.dataset, self.batch_size = dataset, batch_size

    def train_dataloader(self):
        sampler = DistributedSampler(self.dataset)
        return DataLoader(self.dataset, batch_size=self.batch_size, sampler=sampler)


class ImageModule:
    def __init__(self, dataset, batch_size):
        self.dataset, self.batch_size = dataset, batch_size

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True)
"""

_TRAIN = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from data import VideoModule


def main(model, dataset, local_rank):
    dist.init_process_group("nccl")
    ddp = DDP(model, device_ids=[local_rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loader = VideoModule(dataset, 8).train_dataloader()
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        for x in loader:
            ddp(x).sum().backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None, None, 0)
"""


def _gt003(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT003")


def test_a_loader_of_a_class_nothing_names(tmp_path: Path) -> None:
    assert _gt003(tmp_path, {"data.py": _DATA, "train.py": _TRAIN}) == []


def test_the_same_class_made_by_the_script_is_reported(tmp_path: Path) -> None:
    train = _TRAIN.replace("from data import VideoModule", "from data import ImageModule")
    train = train.replace("VideoModule(dataset, 8)", "ImageModule(dataset, 8)")
    train = train.replace("        loader.sampler.set_epoch(epoch)\n", "")
    found = _gt003(tmp_path, {"data.py": _DATA, "train.py": train})
    assert found == [("data.py", 18), ("train.py", 12)]  # the loader, and the call making it


def test_a_class_named_by_a_hydra_target_is_reported(tmp_path: Path) -> None:
    train = _TRAIN.replace(
        "from data import VideoModule\n", "from hydra.utils import instantiate\n"
    )
    train = train.replace(
        "def main(model, dataset, local_rank):", "def main(model, dataset, local_rank, cfg):"
    )
    train = train.replace("VideoModule(dataset, 8)", "instantiate(cfg.data, dataset=dataset)")
    train = train.replace("        loader.sampler.set_epoch(epoch)\n", "")
    train = train.replace("main(None, None, 0)", "main(None, None, 0, None)")
    config = "data:\n  _target_: data.ImageModule\n  batch_size: 8\n"
    files = {"data.py": _DATA, "train.py": train, "configs/train.yaml": config}
    assert _gt003(tmp_path, files) == [("data.py", 18)]
