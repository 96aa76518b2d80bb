"""``gpu-training lint`` ``GT003``: a loader over a dataset that shards itself by rank.

A ``DataLoader`` with no sampler gives each rank its own data when the dataset splits itself:
an ``IterableDataset`` whose ``__iter__`` strides by ``get_rank()`` (and the worker id), a
map-style dataset that keeps ``files[rank::world]``, a Hugging Face dataset passed through
``.shard(num_shards=..., index=rank)`` or ``split_dataset_by_node``; built inline, in a
helper, or in a data-module method (``dm.train_dataloader()``). A dataset that reads the rank
only to print on rank 0 is not sharded. Minimal reproductions written here (issue 33, set 16:
a streaming dataset sharded by (rank, worker) behind a DataModule).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths
from lint_repo import repo_findings

_STREAM = """\
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class TokenStream(IterableDataset):
    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        rank, world = 0, 1
        if torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
            world = torch.distributed.get_world_size()
        info = get_worker_info()
        workers = info.num_workers if info else 1
        wid = info.id if info else 0
        for i, row in enumerate(self.rows):
            if i % (world * workers) == rank * workers + wid:
                yield row


class DataModule:
    def __init__(self, rows, batch_size):
        self.rows, self.batch_size = rows, batch_size
        self.train_ds = None

    def prepare(self):
        self.train_ds = TokenStream(self.rows)

    def train_dataloader(self):
        return DataLoader(self.train_ds, batch_size=self.batch_size, drop_last=True)
"""

_MAP_STYLE = """\
import os

from torch.utils.data import DataLoader, Dataset


class ShardFiles(Dataset):
    def __init__(self, files):
        rank = int(os.environ.get("RANK", 0))
        world = int(os.environ.get("WORLD_SIZE", 1))
        self.files = sorted(files)[rank::world]

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return self.files[i]


def train_dataloader(files, batch_size):
    dataset = ShardFiles(files)
    return DataLoader(dataset, batch_size=batch_size)
"""

_HF_SHARD = """\
import torch.distributed as dist
from datasets import load_dataset
from torch.utils.data import DataLoader


def train_dataloader(path, batch_size):
    ds = load_dataset("json", data_files=path)["train"]
    ds = ds.shard(num_shards=dist.get_world_size(), index=dist.get_rank())
    return DataLoader(ds, batch_size=batch_size)
"""

_HF_SPLIT = """\
import os

from datasets import load_dataset
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader


def train_dataloader(path, batch_size):
    stream = load_dataset("json", data_files=path, streaming=True)["train"]
    mine = split_dataset_by_node(stream, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    return DataLoader(mine, batch_size=batch_size)
"""

_RANK_ZERO_PRINT = """\
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Pairs(Dataset):
    def __init__(self, rows):
        self.rows = rows
        if dist.get_rank() == 0:
            print(f"{len(rows)} rows")

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def train_dataloader(rows, batch_size):
    return DataLoader(Pairs(rows), batch_size=batch_size, shuffle=True)
"""

_TRAIN = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

{imports}


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(8, 8).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters())
    {make}
    for batch in loader:
        loss = model(batch.cuda()).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

_CASES = {
    "stream_datamodule": (
        _STREAM,
        "from data import DataModule",
        "dm = DataModule(list(range(100)), 8)\n    dm.prepare()\n"
        "    loader = dm.train_dataloader()",
    ),
    "map_style_env_rank": (
        _MAP_STYLE,
        "from data import train_dataloader",
        "loader = train_dataloader(['a', 'b'], 8)",
    ),
    "hf_shard": (
        _HF_SHARD,
        "from data import train_dataloader",
        "loader = train_dataloader('x', 8)",
    ),
    "hf_split_by_node": (
        _HF_SPLIT,
        "from data import train_dataloader",
        "loader = train_dataloader('x', 8)",
    ),
}


def _findings(tmp_path: Path, data: str, imports: str, make: str) -> set[tuple[str, str]]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "data.py").write_text(data)
    (tmp_path / "train.py").write_text(_TRAIN.format(imports=imports, make=make))
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {(Path(f.path).name, f.code) for f in report.findings}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_a_loader_over_a_self_sharding_dataset_is_not_gt003(tmp_path: Path, case: str) -> None:
    data, imports, make = _CASES[case]
    assert ("train.py", "GT003") not in _findings(tmp_path, data, imports, make)


def test_a_dataset_that_reads_the_rank_only_to_print_keeps_gt003(tmp_path: Path) -> None:
    found = _findings(
        tmp_path,
        _RANK_ZERO_PRINT,
        "from data import train_dataloader",
        "loader = train_dataloader([1, 2], 8)",
    )
    assert ("train.py", "GT003") in found


def test_the_same_file_iterable_class_sharded_by_rank_is_not_gt003(tmp_path: Path) -> None:
    body = _STREAM.replace("class DataModule", "class _Unused") + _TRAIN.format(
        imports="", make="loader = DataLoader(TokenStream(list(range(9))), batch_size=4)"
    ).replace("import os\n", "import os\n", 1)
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(body)
    report = lint_paths([tmp_path])
    assert "GT003" not in {f.code for f in report.findings}


def test_a_ranking_dataset_is_not_taken_for_a_sharded_one(tmp_path: Path) -> None:
    data = _RANK_ZERO_PRINT.replace(
        '        if dist.get_rank() == 0:\n            print(f"{len(rows)} rows")\n',
        "        self.ranking = [r[1] for r in rows]\n",
    )
    found = _findings(
        tmp_path, data, "from data import train_dataloader", "loader = train_dataloader([1, 2], 8)"
    )
    assert ("train.py", "GT003") in found


_PACKED = """\
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class PackedDataLoader:
    def __init__(self, path, seq_len, batch_size, rank=0, world_size=1):
        data = np.memmap(path, dtype=np.uint16, mode="r")
        shard = len(data) // world_size
        self.data = data[rank * shard : (rank + 1) * shard]
        self.seq_len, self.batch_size = seq_len, batch_size
        self._start_workers()

    def _start_workers(self):
        outer = self

        class _ShardDataset(Dataset):
            def __len__(self):
                return 1 << 30

            def __getitem__(self, _):
                i = torch.randint(len(outer.data) - outer.seq_len, (1,)).item()
                return torch.from_numpy(outer.data[i : i + outer.seq_len].astype(np.int64))

        self.loader = DataLoader(_ShardDataset(), batch_size=None, num_workers=2)


def main():
    dist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    train = PackedDataLoader("train.bin", 512, 8, dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("sharded", [True, False])
def test_a_dataset_class_defined_by_a_loader_that_keeps_its_rank_shard(
    tmp_path: Path, sharded: bool
) -> None:
    # set 22: a loader class keeps data[rank * shard:...] in __init__ and builds its
    # DataLoader over a local Dataset class that draws from that shard (outer.data)
    source = (
        _PACKED if sharded else _PACKED.replace("data[rank * shard : (rank + 1) * shard]", "data")
    )
    source = source if sharded else source.replace(", rank=0, world_size=1", "")
    source = source if sharded else source.replace("len(data) // world_size", "len(data)")
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(source)
    found = {f.line for f in lint_paths([tmp_path]).findings if f.code == "GT003"}
    line = 1 + source.splitlines().index(
        "        self.loader = DataLoader(_ShardDataset(), batch_size=None, num_workers=2)"
    )
    assert found == (set() if sharded else {line})


_INJECTED = """\
import torch
import torch.distributed as dist


class InterleavedStream(torch.utils.data.IterableDataset):
    def __init__(self, sources, rank, world_size):
        self.sources, self.rank, self.world_size = sources, rank, world_size

    def __iter__(self):
        for i, item in enumerate(self.sources):
            if i % self.world_size == self.rank:
                yield item


class Trainer:
    def __init__(self, model, train_dataset, batch_size):
        self.model = torch.nn.parallel.DistributedDataParallel(model)
        self.train_dataset = train_dataset
        self.batch_size = batch_size
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def _create_dataloader(self):
        return torch.utils.data.DataLoader(self.train_dataset, batch_size=self.batch_size)

    def train(self):
        for batch in self._create_dataloader():
            self.model(batch).sum().backward()
            self.opt.step()


def main(model, sources):
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = {dataset}
    Trainer(model, train_dataset=dataset, batch_size=8).train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None, [])
"""


def test_a_sharded_stream_handed_to_the_trainer_that_loads_it(tmp_path: Path) -> None:
    """Issue 33, held-back set 23: the trainer's constructor keeps the dataset it is handed
    (``self.train_dataset = train_dataset``), built by the caller as a project
    ``IterableDataset`` that reads the rank: no ``DistributedSampler`` is missing."""
    text = _INJECTED.replace("{dataset}", "InterleavedStream(sources, rank, world)")
    assert repo_findings(tmp_path, {"train.py": text}, "GT003") == []


def test_a_plain_list_handed_to_the_trainer_that_loads_it(tmp_path: Path) -> None:
    text = _INJECTED.replace("{dataset}", "list(sources)")
    assert repo_findings(tmp_path, {"train.py": text}, "GT003") == [("train.py", 23)]
