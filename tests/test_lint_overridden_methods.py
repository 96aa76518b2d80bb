"""``gpu-training lint``: a base-class method that the distributed subclass overrides runs
only on the single-process path.

A plain trainer class builds a shuffled loader and puts the model on ``torch.device("cuda")``;
its distributed subclass joins a process group and overrides both methods. Under the group
the base versions never run, so ``GT002``/``GT003`` do not apply inside them; a method the
subclass inherits as it is (or whose override calls ``super()``) still runs on every rank.
Minimal reproductions written here (issue 33, set 15: a "monolith" trainer beside its
distributed subclass), with variants in other shapes.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths

_SAME_FILE = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler


class Trainer:
    def loader(self, dataset):
        return DataLoader(dataset, batch_size=8, shuffle=True)

    def run(self, dataset):
        device = torch.device("cuda")
        model = self.build().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in self.loader(dataset):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
            optimizer.step()


class DistTrainer(Trainer):
    def setup(self, rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)

    def loader(self, dataset):
        return DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))

    def run(self, rank, world_size, dataset):
        self.setup(rank, world_size)
        model = DistributedDataParallel(self.build().to(rank), device_ids=[rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in self.loader(dataset):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x.to(rank)), y.to(rank)).backward()
            optimizer.step()
        dist.destroy_process_group()
"""

_BASE_MODULE = """\
import torch
from torch.utils.data import DataLoader


class BaseRunner:
    def make_loader(self, data):
        return DataLoader(data, batch_size=16, shuffle=True, num_workers=2)

    def fit(self, data):
        net = self.net.cuda()
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        for batch in self.make_loader(data):
            opt.zero_grad()
            net(batch.cuda()).mean().backward()
            opt.step()
"""

_DDP_MODULE = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from base import BaseRunner


class DDPRunner(BaseRunner):
    def make_loader(self, data):
        return DataLoader(data, batch_size=16, sampler=DistributedSampler(data){super_call})

    def fit(self, data):
        dist.init_process_group(backend="nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        net = DDP(self.net.cuda(), device_ids=[local_rank])
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        for batch in self.make_loader(data):
            opt.zero_grad()
            net(batch.cuda()).mean().backward()
            opt.step()
        dist.destroy_process_group()
"""


def _lint(root: Path) -> set[tuple[str, int, str]]:
    report = lint_paths([root])
    assert not report.errors, report.errors
    return {(Path(f.path).name, f.line, f.code) for f in report.findings}


def test_the_base_methods_the_distributed_subclass_overrides_are_not_reported(
    tmp_path: Path,
) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "trainer.py").write_text(_SAME_FILE)
    found = _lint(tmp_path)
    assert not {(line, code) for _, line, code in found if line < 20} & {
        (9, "GT003"),
        (12, "GT002"),
    }


def test_a_base_module_whose_methods_the_ddp_subclass_overrides(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "base.py").write_text(_BASE_MODULE)
    (tmp_path / "ddp.py").write_text(_DDP_MODULE.format(super_call=""))
    found = _lint(tmp_path)
    assert not {code for name, _, code in found if name == "base.py"} & {"GT002", "GT003"}


def _without_override(source: str, name: str) -> str:
    """``source`` with the subclass's override of ``name`` taken out (the last ``def name``)."""
    start = source.rindex(f"    def {name}(")
    end = source.find("\n    def ", start + 1)
    return source[:start] + (source[end + 1 :] if end != -1 else "")


def test_a_loader_the_subclass_inherits_still_runs_on_every_rank(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "trainer.py").write_text(_without_override(_SAME_FILE, "loader"))
    assert ("trainer.py", 9, "GT003") in _lint(tmp_path)


def test_an_override_that_calls_super_runs_the_base_method(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    source = _SAME_FILE.replace(
        "        self.setup(rank, world_size)\n",
        "        self.setup(rank, world_size)\n        return super().run(dataset)\n",
    )
    (tmp_path / "trainer.py").write_text(source)
    assert ("trainer.py", 12, "GT002") in _lint(tmp_path)


def test_a_base_class_that_joins_the_group_itself_keeps_its_findings(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    source = _SAME_FILE.replace(
        "    def run(self, dataset):\n",
        "    def run(self, dataset):\n        dist.init_process_group('nccl')\n",
    )
    (tmp_path / "trainer.py").write_text(source)
    assert ("trainer.py", 9, "GT003") in _lint(tmp_path)
