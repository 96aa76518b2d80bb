"""``gpu-training lint`` ``GT004``/``GT003`` through a loader's ``**kwargs`` dicts.

Issue 33, held-back set 23 (a public GPT fine-tuning repository): ``train_kwargs =
{"sampler": train_sampler}``, ``train_kwargs.update(cuda_kwargs)`` where ``cuda_kwargs``
holds ``"shuffle": True``, then ``DataLoader(train_dataset, **train_kwargs)``: the loader gets a
``DistributedSampler`` and ``shuffle=True`` together, which ``DataLoader`` refuses with a
``ValueError`` on every rank (``GT004``, missed: arguments behind ``**`` were not read). The
same dicts, read, also show a loader with no sampler at all (``GT003``), the PyTorch MNIST
example's layout run under DDP. Minimal reproductions written here, with the variants that stay
quiet.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def main(dataset, batch_size):
    dist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedSampler(dataset, shuffle=True)
    cuda_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
    train_kwargs = {"batch_size": batch_size, "sampler": sampler}
    train_kwargs.update(cuda_kwargs)
    loader = DataLoader(dataset, **train_kwargs)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            model(x).sum().backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None, 8)
"""


def test_shuffle_and_a_sampler_from_the_kwargs_dicts(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _SCRIPT}, "GT004") == [("train.py", 14)]


def test_the_dicts_without_shuffle(tmp_path: Path) -> None:
    text = _SCRIPT.replace(', "shuffle": True}', "}")
    assert repo_findings(tmp_path, {"train.py": text}, "GT004") == []


def test_no_sampler_in_the_kwargs_dicts(tmp_path: Path) -> None:
    text = _SCRIPT.replace(', "sampler": sampler}', "}").replace(
        "        sampler.set_epoch(epoch)\n", ""
    )
    assert repo_findings(tmp_path, {"train.py": text}, "GT003") == [("train.py", 14)]


def test_a_dict_of_unknown_content_is_not_guessed(tmp_path: Path) -> None:
    text = _SCRIPT.replace(', "sampler": sampler}', "}").replace(
        "    train_kwargs.update(cuda_kwargs)\n", "    train_kwargs.update(loader_options())\n"
    )
    assert repo_findings(tmp_path, {"train.py": text}, "GT003") == []
    assert repo_findings(tmp_path, {"train.py": text}, "GT004") == []
