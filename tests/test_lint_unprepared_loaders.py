"""``gpu-training lint`` ``GT003``: a training loader of an Accelerate or Fabric script that
never reaches ``prepare()``/``setup_dataloaders()``.

Issue 33, set 19: an Accelerate script builds ``DataLoader(ds, sampler=BatchSampler(
RandomSampler(ds), bs, False))`` and leaves its ``accelerator.prepare(train_dataloader)``
commented out; another wraps the loader in a ``cycle()`` generator and prepares the generator,
which Accelerate passes through unsharded. Either way every process draws the same batches.
Minimal reproductions written here, with variants (a Fabric script that sets up only its model,
``iter()`` instead of a generator, a ``shuffle=True`` loader); not reported: the loader
prepared (directly, or in a list unpacked by ``prepare``), handed to a library trainer or a
project helper that prepares it, returned to a caller, or read only by an evaluation loop.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_ACCELERATE = """\
import torch
from accelerate import Accelerator
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from utils import cycle


def train(dataset, model, steps, batch_size):
    accelerator = Accelerator()
    sampler = BatchSampler(RandomSampler(dataset), batch_size, False)
    train_dataloader = DataLoader(dataset, sampler=sampler, batch_size=None)
{between}    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(steps):
        batch = next(train_dataloader)
        loss = model(batch).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    train(build_dataset(), build_model(), 1000, 64)
"""

_UTILS = """\
def cycle(loader):
    while True:
        for batch in loader:
            yield batch


def prepare_loader(accelerator, loader):
    return accelerator.prepare_data_loader(loader)
"""

_FABRIC = """\
import lightning as L
import torch
from torch.utils.data import DataLoader


def main(dataset, model):
    fabric = L.Fabric(accelerator="cuda", devices=4, strategy="ddp")
    fabric.launch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = fabric.setup(model, optimizer)
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
{between}    for epoch in range(10):
        for x, y in loader:
            optimizer.zero_grad()
            fabric.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()


main(build_dataset(), build_model())
"""


def _gt003(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT003")


@pytest.mark.parametrize(
    "between",
    [
        "    train_dataloader = cycle(train_dataloader)\n",
        "    # train_dataloader = accelerator.prepare(train_dataloader)\n"
        "    train_dataloader = cycle(train_dataloader)\n",
        "    train_dataloader = cycle(train_dataloader)\n"
        "    train_dataloader = accelerator.prepare(train_dataloader)\n",
        "    train_dataloader = iter(train_dataloader)\n",
    ],
)
def test_accelerate_loader_never_prepared(tmp_path: Path, between: str) -> None:
    text = _ACCELERATE.replace("{between}", between)
    assert _gt003(tmp_path, {"train.py": text, "utils.py": _UTILS}) == [("train.py", 11)]


@pytest.mark.parametrize(
    "between",
    [
        "    train_dataloader = accelerator.prepare(train_dataloader)\n"
        "    train_dataloader = cycle(train_dataloader)\n",
        "    (train_dataloader,) = accelerator.prepare(*[train_dataloader])\n"
        "    train_dataloader = cycle(train_dataloader)\n",
        "    train_dataloader = cycle(prepare_loader(accelerator, train_dataloader))\n",
    ],
)
def test_accelerate_loader_prepared(tmp_path: Path, between: str) -> None:
    text = _ACCELERATE.replace("{between}", between).replace(
        "from utils import cycle", "from utils import cycle, prepare_loader"
    )
    assert _gt003(tmp_path, {"train.py": text, "utils.py": _UTILS}) == []


def test_accelerate_loader_handed_to_a_library_trainer(tmp_path: Path) -> None:
    text = _ACCELERATE.replace(
        "{between}", "    runner = Runner(accelerator, train_dataloader)\n"
    ).replace("batch = next(train_dataloader)", "batch = runner.next_batch()")
    assert _gt003(tmp_path, {"train.py": text, "utils.py": _UTILS}) == []


def test_fabric_loader_never_set_up(tmp_path: Path) -> None:
    assert _gt003(tmp_path, {"fit.py": _FABRIC.replace("{between}", "")}) == [("fit.py", 11)]


def test_fabric_loader_set_up(tmp_path: Path) -> None:
    text = _FABRIC.replace("{between}", "    loader = fabric.setup_dataloaders(loader)\n")
    assert _gt003(tmp_path, {"fit.py": text}) == []


def test_fabric_loader_only_evaluated(tmp_path: Path) -> None:
    text = _FABRIC.replace("{between}", "").replace(
        "            optimizer.zero_grad()\n"
        "            fabric.backward(torch.nn.functional.cross_entropy(model(x), y))\n"
        "            optimizer.step()\n",
        "            with torch.no_grad():\n                print(model(x).argmax(-1))\n",
    )
    assert _gt003(tmp_path, {"fit.py": text}) == []


def test_accelerate_loader_returned_to_the_caller(tmp_path: Path) -> None:
    text = """\
from accelerate import Accelerator
from torch.utils.data import DataLoader


def make_loaders(accelerator, train_set):
    with accelerator.main_process_first():
        train_set = train_set.map(tokenize)
    train_loader = DataLoader(train_set, shuffle=True, batch_size=8)
    return train_loader


def main():
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(
        build_model(), build_optimizer(), make_loaders(accelerator, load())
    )
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()


main()
"""
    assert _gt003(tmp_path, {"main.py": text}) == []


_STREAM = """\
import torch
from torch.utils.data import IterableDataset


class TokenStream(IterableDataset):
    def __init__(self, rows, block):
        self.rows = rows
        self.block = block

    def __iter__(self):
{body}
"""

_UNSPLIT = """\
        buffer = []
        for row in self.rows:
            buffer += row
            while len(buffer) > self.block:
                yield torch.tensor(buffer[: self.block])
                buffer = buffer[self.block :]"""

_SPLIT = """\
        rank = torch.distributed.get_rank()
        world = torch.distributed.get_world_size()
        for i, row in enumerate(self.rows):
            if i % world == rank:
                yield torch.tensor(row[: self.block])"""

_FABRIC_TRAINER = """\
import lightning as L
import torch
from torch.utils.data import DataLoader

from stream import TokenStream


class Pretrainer:
    def __init__(self, cfg, model, rows):
        self.fabric = L.Fabric(devices=cfg.gpus, num_nodes=cfg.nodes, strategy="ddp")
        self.fabric.launch()
        self.dataset = {dataset}
        self.loader = DataLoader(self.dataset, batch_size=cfg.batch_size)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.model, self.opt = self.fabric.setup(model, opt)
        self.loader = self.fabric.setup_dataloaders(self.loader)

    def fit(self):
        bar = tqdm(self.loader, disable=self.fabric.global_rank != 0)
        for step, batch in enumerate(bar):
            loss = self.model(batch).mean()
            self.fabric.backward(loss)
            self.opt.step()
            self.opt.zero_grad()


Pretrainer(load_cfg(), build_model(), read_rows()).fit()
"""


@pytest.mark.parametrize(
    ("body", "dataset", "expected"),
    [
        (_UNSPLIT, "TokenStream(rows, 512)", [("trainer.py", 13)]),
        (_SPLIT, "TokenStream(rows, 512)", []),
        (_UNSPLIT, "torch.utils.data.TensorDataset(torch.tensor(rows))", []),
    ],
)
def test_fabric_iterable_dataset_set_up(
    tmp_path: Path, body: str, dataset: str, expected: list[tuple[str, int]]
) -> None:
    """``setup_dataloaders`` cannot shard an ``IterableDataset``: it must split itself."""
    files = {
        "trainer.py": _FABRIC_TRAINER.replace("{dataset}", dataset),
        "stream.py": _STREAM.replace("{body}", body),
    }
    assert _gt003(tmp_path, files) == expected


_DDP_TRAINER = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from stream import TokenStream


def main(model, rows):
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = DDP(model.cuda())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_loader = DataLoader({dataset}, batch_size=8)
    for batch in train_loader:
        loss = model(batch.cuda()).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(build_model(), read_rows())
"""


@pytest.mark.parametrize(
    ("body", "expected"),
    [(_UNSPLIT, [("trainer.py", 16)]), (_SPLIT, [])],
    ids=["never-splits", "splits-by-rank"],
)
def test_ddp_iterable_dataset(tmp_path: Path, body: str, expected: list[tuple[str, int]]) -> None:
    """A plain DDP script has no framework to shard the stream either: an ``IterableDataset``
    that never reads the rank gives every rank the same batches (round 21: the Fabric check,
    for every script without a framework)."""
    # named as one: the ordinary check leaves an IterableDataset to shard itself
    files = {
        "trainer.py": _DDP_TRAINER.replace("{dataset}", "IterableTokens(rows, 512)").replace(
            "import TokenStream", "import IterableTokens"
        ),
        "stream.py": _STREAM.replace("{body}", body).replace("TokenStream", "IterableTokens"),
    }
    assert _gt003(tmp_path, files) == expected


def test_accelerate_prepares_an_iterable_dataset(tmp_path: Path) -> None:
    """Accelerate's ``prepare`` dispatches an iterable loader's batches across processes."""
    text = (
        _FABRIC_TRAINER.replace("{dataset}", "TokenStream(rows, 512)")
        .replace("import lightning as L\n", "from accelerate import Accelerator\n")
        .replace(
            '        self.fabric = L.Fabric(devices=cfg.gpus, num_nodes=cfg.nodes, strategy="ddp")\n'
            "        self.fabric.launch()\n",
            "        self.fabric = Accelerator()\n",
        )
        .replace("self.fabric.setup(model, opt)", "self.fabric.prepare(model, opt)")
        .replace("self.fabric.setup_dataloaders(self.loader)", "self.fabric.prepare(self.loader)")
        .replace("self.fabric.global_rank != 0", "not self.fabric.is_main_process")
    )
    files = {"trainer.py": text, "stream.py": _STREAM.replace("{body}", _UNSPLIT)}
    assert _gt003(tmp_path, files) == []


def test_accelerate_loader_built_on_either_branch_then_prepared(tmp_path: Path) -> None:
    """Each branch builds the loader; the one ``prepare`` after the ``if`` gets either."""
    text = """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
model = build_model()
if use_real_data():
    dl = torch.utils.data.DataLoader(load_real(), batch_size=1, shuffle=False)
else:
    dl = torch.utils.data.DataLoader(make_fake(), batch_size=1)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
model, optimizer, dl = accelerator.prepare(model, optimizer, dl)
for batch in dl:
    optimizer.zero_grad()
    accelerator.backward(model(**batch).loss)
    optimizer.step()
"""
    assert _gt003(tmp_path, {"sp.py": text}) == []
