"""``gpu-training lint`` ``GT003``: a validation loader named by its key in a dict, or by the
one name that says ``loader`` where a helper's result is unpacked.

Issue 33, the sixth random sample of findings (``benchmarks/lint_ddpsample6_triage.csv``): a
DDP script keeps its loaders in ``dataloaders = {"train": DataLoader(image_datasets["train"],
sampler=...), "val": DataLoader(image_datasets["val"])}``. Loaders whose name says validation
are not ``GT003``'s (every rank may evaluate the whole set), but the name was looked for in the
variable alone, and the ``"val"`` loader was reported. The split's key names the loader, as the
dataset's key does. A training loader kept the same way stays reported. And from the first,
second and sixth samples (AICITY ``train_stage2_v1.py``/``v2.py``): ``aug_loader, num_query, _ =
get_testloader_uda(cfg)`` was reported as a training loader because an unpacked result was
followed nowhere; the one unpacked name that says ``loader`` is now followed to its uses (here
a feature extraction under ``no_grad``, which every rank must run on the whole set). Minimal
reproductions written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def main(image_datasets):
    dist.init_process_group("nccl")
    dataloaders = {
        "train": DataLoader(image_datasets["train"], sampler=DistributedSampler(image_datasets["train"])),
        KEY: DataLoader(image_datasets[KEY], batch_size=8),
    }
    return dataloaders


if __name__ == "__main__":
    main({})
"""


@pytest.mark.parametrize("key", ['"val"', '"test"'])
def test_a_loader_keyed_for_validation_is_not_reported(tmp_path: Path, key: str) -> None:
    files = {"distributed_train.py": _SCRIPT.replace("KEY", key)}
    assert repo_findings(tmp_path, files, "GT003") == []


def test_a_loader_keyed_for_training_stays_reported(tmp_path: Path) -> None:
    files = {"distributed_train.py": _SCRIPT.replace("KEY", '"extra"')}
    assert len(repo_findings(tmp_path, files, "GT003")) == 1


# --- a loader a project helper returns with other values, unpacked ------------------------------

_HELPER = """\
from torch.utils.data import DataLoader


def get_testloader(dataset):
    loader = DataLoader(dataset, batch_size=8, shuffle=False)
    return loader, len(dataset)
"""

_TRAIN = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from make_dataloader import get_testloader


def extract_features(model, data_loader):
    feats = []
    with torch.no_grad():
        for batch in data_loader:
            feats.append(model(batch))
    return torch.cat(feats)


def main(model, optimizer, dataset, train_set):
    dist.init_process_group("nccl")
    NAME, num_query = get_testloader(dataset)
    train_loader = DataLoader(train_set, sampler=DistributedSampler(train_set))
    for epoch in range(3):
        features = extract_features(model, NAME)
        for batch in USE:
            model(batch).sum().backward()
            optimizer.step()


if __name__ == "__main__":
    main(None, None, [], [])
"""


@pytest.mark.parametrize("name", ["aug_loader", "val_loader"])
def test_an_unpacked_loader_only_evaluated_is_not_reported(tmp_path: Path, name: str) -> None:
    files = {
        "make_dataloader.py": _HELPER,
        "train_stage2.py": _TRAIN.replace("NAME", name).replace("USE", "train_loader"),
    }
    assert repo_findings(tmp_path, files, "GT003") == []


def test_an_unpacked_loader_that_trains_stays_reported(tmp_path: Path) -> None:
    files = {
        "make_dataloader.py": _HELPER,
        "train_stage2.py": _TRAIN.replace("NAME", "aug_loader").replace("USE", "aug_loader"),
    }
    assert len(repo_findings(tmp_path, files, "GT003")) == 1
