"""``gpu-training lint`` on a trainer class whose loop goes through helpers and wrappers.

Issue 33, misses of held-back set 20 (a dataclass trainer of a public recipe repository, and a
DETR-style script): the batch loop iterates ``tqdm(self.train_dataloader)`` through a local
name (``GT005``: the epoch loop calls that method and never sets the sampler's epoch); the
micro-batch's backward runs in a method of the class (``self._backward(loss)`` divides the
loss and calls ``loss.backward()``) while the optimizer steps every ``batch_split``
micro-batches (``GT013``); and a file opened for writing with ``codecs.open`` on every rank
(``GT007``). Minimal reproductions written here, with the variants that stay quiet.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_TRAINER = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler
from tqdm.auto import tqdm


class Trainer:
    def __init__(self, model, dataset, n_epochs, batch_split, local_rank):
        dist.init_process_group("nccl")
        torch.cuda.set_device(local_rank)
        self.local_rank = local_rank
        self.train_dataset = dataset
        self.model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
        self.train_dataloader = Trainer._init_dataloader(
            dataset, batch_size=8, sampler=self._init_train_sampler()
        )
        self.n_epochs = n_epochs
        self.batch_split = batch_split
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def _init_train_sampler(self):
        if self.local_rank == -1:
            return RandomSampler(self.train_dataset)
        return DistributedSampler(self.train_dataset)

    @staticmethod
    def _init_dataloader(dataset, *, batch_size=1, sampler=None):
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=False)

    def _backward(self, loss):
        loss = loss / self.batch_split
        loss.backward()

    def train(self):
        for epoch_i in range(1, self.n_epochs + 1):
            self._train(epoch_i)

    def _train(self, epoch_i):
        bar = tqdm(self.train_dataloader, desc=f"epoch {epoch_i}")
        for i, (inputs, labels) in enumerate(bar):
            pred = self.model(inputs)
            self._backward(torch.nn.functional.mse_loss(pred, labels))
            if (i + 1) % self.batch_split == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()


def main():
    Trainer(torch.nn.Linear(2, 2), list(range(10)), 3, 4, 0).train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def test_an_epoch_loop_over_a_tqdm_bar_of_the_objects_loader(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"trainer.py": _TRAINER}, "GT005") == [("trainer.py", 35)]


def test_the_sampler_whose_epoch_is_set_before_the_pass(tmp_path: Path) -> None:
    text = _TRAINER.replace(
        "        bar = tqdm(",
        "        self.train_dataloader.sampler.set_epoch(epoch_i)\n        bar = tqdm(",
    )
    assert repo_findings(tmp_path, {"trainer.py": text}, "GT005") == []


def test_a_backward_helper_in_an_accumulation_loop(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"trainer.py": _TRAINER}, "GT013") == [("trainer.py", 42)]


def test_a_helper_that_steps_too_is_no_micro_batch_backward(tmp_path: Path) -> None:
    text = _TRAINER.replace(
        "        loss.backward()\n",
        "        loss.backward()\n        self.optimizer.step()\n",
    )
    assert repo_findings(tmp_path, {"trainer.py": text}, "GT013") == []


def test_a_backward_helper_under_no_sync_off_the_boundary(tmp_path: Path) -> None:
    text = _TRAINER.replace(
        "            self._backward(torch.nn.functional.mse_loss(pred, labels))\n",
        "            if (i + 1) % self.batch_split != 0:\n"
        "                with self.model.no_sync():\n"
        "                    self._backward(torch.nn.functional.mse_loss(pred, labels))\n"
        "            else:\n"
        "                self._backward(torch.nn.functional.mse_loss(pred, labels))\n",
    )
    assert repo_findings(tmp_path, {"trainer.py": text}, "GT013") == []


_CODECS = """\
import codecs
import json
import os

import torch.distributed as dist


def main(args, save_dir):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    with codecs.open(os.path.join(save_dir, "config.json"), "w", "utf-8") as file:
        json.dump(vars(args), file)
    if rank == 0:
        with codecs.open(os.path.join(save_dir, "summary.json"), "w", "utf-8") as file:
            json.dump({}, file)
    with codecs.open(os.path.join(save_dir, "config.json"), "r", "utf-8") as file:
        json.load(file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None, "out")
"""


def test_a_file_opened_for_writing_with_codecs_on_every_rank(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"main.py": _CODECS}, "GT007") == [("main.py", 11)]
