"""``gpu-training lint`` ``GT003``: a project class that happens to be called ``DataLoader``.

Issue 33, set 19 (a false finding): a DDP pretraining script defines its own ``class
DataLoader:`` that reads token files and hands out batches by its own ``get_batch``; each rank
skips ``local_rank`` batches to interleave. It takes no sampler, and torch's sampler rules do
not apply to it. Minimal reproductions written here, with a variant (the class imported from a
module of the project); still reported: a project subclass of torch's
``DataLoader`` built with no sampler.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_OWN = """\
import numpy as np


class DataLoader:
    def __init__(self, paths, block_size=256):
        self.data = [np.memmap(p, dtype=np.uint16, mode="r") for p in paths]
        self.block_size = block_size
        self.cursor = 0

    def get_batch(self, batch_size):
        rows = self.data[0][self.cursor : self.cursor + batch_size * self.block_size]
        self.cursor += batch_size * self.block_size
        return rows.reshape(batch_size, self.block_size)
"""

_SUBCLASS = """\
import torch


class DataLoader(torch.utils.data.DataLoader):
    def __init__(self, dataset, batch_size=8):
        super().__init__(dataset, batch_size=batch_size, shuffle=True)
"""

_TRAIN = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

{import_line}


def main(paths, model):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(model.cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    train_data = DataLoader(paths)
    for _ in range(local_rank):
        train_data.get_batch(8)
    for step in range(1000):
        x = torch.as_tensor(train_data.get_batch(8)).cuda()
        optimizer.zero_grad()
        model(x).mean().backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(["train.bin"], build_model())
"""


def _gt003(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT003")


def test_own_loader_class_in_the_script(tmp_path: Path) -> None:
    own = _OWN.replace("import numpy as np\n", "")
    text = _TRAIN.replace("{import_line}", "import numpy as np\n\n" + own)
    assert _gt003(tmp_path, {"train.py": text}) == []


def test_own_loader_class_imported(tmp_path: Path) -> None:
    text = _TRAIN.replace("{import_line}", "from data import DataLoader")
    assert _gt003(tmp_path, {"train.py": text, "data.py": _OWN}) == []


@pytest.mark.parametrize("module", ["data", "loaders"])
def test_subclass_of_torch_loader_still_checked(tmp_path: Path, module: str) -> None:
    text = _TRAIN.replace("{import_line}", f"from {module} import DataLoader").replace(
        "train_data = DataLoader(paths)", "train_data = DataLoader(build_dataset(paths))"
    )
    files = {"train.py": text, f"{module}.py": _SUBCLASS}
    assert _gt003(tmp_path, files) == [("train.py", 16)]


def test_torch_loader_still_checked(tmp_path: Path) -> None:
    text = _TRAIN.replace("{import_line}", "from torch.utils.data import DataLoader").replace(
        "train_data = DataLoader(paths)", "train_data = DataLoader(build_dataset(paths))"
    )
    assert _gt003(tmp_path, {"train.py": text}) == [("train.py", 16)]
