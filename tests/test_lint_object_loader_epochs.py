"""``gpu-training lint`` ``GT005``: the epoch loop passes over a loader an object of the
project's own class holds, and the class's shuffling ``DistributedSampler`` never gets
``set_epoch``.

Issue 33, set 18: ``dataset = Dataset(cfg, tokenizer)`` (a class of another module whose
method builds ``self.train_dataloader = DataLoader(..., sampler=DistributedSampler(...,
shuffle=True))``), then ``for epoch ...: it = iter(dataset.train_dataloader)`` and ``for _ in
range(len(dataset.train_dataloader)): batch = next(it)``: each epoch is a pass over the loader
(counted by its length) in the epoch-0 order. Minimal reproductions written here, with
variants; not reported: a sampler whose epoch is set, a sampler that does not shuffle.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_DATA_MODULE = """\
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


class TextData:
    def __init__(self, config, tokenizer):
        self.config = config
        self.tokenizer = tokenizer

    def setup_dataloaders(self):
        sampler = DistributedSampler(
            self.config.train_ds, dist.get_world_size(), dist.get_rank(), shuffle=True
        )
        self.train_dataloader = DataLoader(self.config.train_ds, batch_size=8, sampler=sampler)
"""

_COUNTED_MAIN = """\
import torch.distributed as dist

from data import TextData


def main(cfg, trainer):
    dist.init_process_group("nccl")
    dataset = TextData(cfg, None)
    trainer.prepare(dataset)
    for epoch in range(cfg.epochs):
        trainer.model.train()
        batches = iter(dataset.train_dataloader)
        for _ in range(len(dataset.train_dataloader)):
            batch = next(batches)
            trainer.step(batch, epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None, None)
"""

_DIRECT_MAIN = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from data import TextData


def run(cfg, model, local_rank):
    dist.init_process_group("nccl")
    corpus = TextData(cfg, None)
    corpus.setup_dataloaders()
    ddp = DDP(model, device_ids=[local_rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for epoch in range(10):
        for batch in corpus.train_dataloader:
            ddp(batch).sum().backward()
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    run(None, None, 0)
"""


def _gt005(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT005")


def test_an_epoch_loop_counting_the_batches_of_an_objects_loader(tmp_path: Path) -> None:
    files = {"data.py": _DATA_MODULE, "main.py": _COUNTED_MAIN}
    assert _gt005(tmp_path, files) == [("main.py", 10)]


def test_an_epoch_loop_over_an_objects_loader(tmp_path: Path) -> None:
    files = {"data.py": _DATA_MODULE, "train.py": _DIRECT_MAIN}
    assert _gt005(tmp_path, files) == [("train.py", 14)]


def test_a_sampler_whose_epoch_is_set_by_the_class(tmp_path: Path) -> None:
    data = _DATA_MODULE.replace(
        "        self.train_dataloader =",
        "        self.sampler = sampler\n        self.train_dataloader =",
    ) + ("\n    def new_epoch(self, epoch):\n        self.sampler.set_epoch(epoch)\n")
    main = _DIRECT_MAIN.replace(
        "        for batch in corpus",
        "        corpus.new_epoch(epoch)\n        for batch in corpus",
    )
    assert _gt005(tmp_path, {"data.py": data, "train.py": main}) == []


def test_a_sampler_that_does_not_shuffle(tmp_path: Path) -> None:
    data = _DATA_MODULE.replace("shuffle=True", "shuffle=False")
    assert _gt005(tmp_path, {"data.py": data, "main.py": _COUNTED_MAIN}) == []
