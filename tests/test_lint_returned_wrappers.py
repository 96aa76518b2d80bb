"""``gpu-training lint`` ``GT006``: the DDP wrapper reached through a trainer's return value or
handed by keyword to a helper that saves its ``state_dict()``.

Issue 33, set 19. A trainer class wraps its model (``self.model = DDP(...)``) and its
``train()`` returns ``self.model``: ``model = trainer.train(epochs)`` is the wrapper, so
``torch.save(model)`` pickles it and ``torch.save(model.state_dict())`` writes ``module.`` keys
(``train`` is also ``nn.Module.train()``, which returns the module itself: a method of the
project's own class returns what its body returns). And a logger helper ``def
save_checkpoint(self, model, ...): torch.save({"state_dict": model.state_dict()}, ...)`` given
the wrapper as ``model=self.model`` (by keyword) saves ``module.`` keys as it does when given
it by position. Minimal reproductions written here, with variants (a function that returns the
wrapper, FSDP-less DeepSpeed-style engine naming, a plain helper function); not reported: the
trainer returns the unwrapped module, or the caller hands ``model.module``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_TRAINER = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, rank, loader):
        self.model = DDP(model.to(rank), device_ids=[rank])
        self.loader = loader
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train(self, epochs):
        for _ in range(epochs):
            for x, y in self.loader:
                self.optimizer.zero_grad()
                torch.nn.functional.mse_loss(self.model(x), y).backward()
                self.optimizer.step()
        return {returned}


def main(rank, world_size, loader):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    trainer = Trainer(torch.nn.Linear(8, 8), rank, loader)
    model = trainer.train(3)
    if rank == 0:
        torch.save({saved}, "model.pt")
    dist.destroy_process_group()
"""

_FIT_FUNCTION = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def fit(net, loader):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    wrapped = DistributedDataParallel(net.cuda(), device_ids=[local_rank])
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    for batch in loader:
        opt.zero_grad()
        wrapped(batch).mean().backward()
        opt.step()
    return wrapped, opt


if __name__ == "__main__":
    dist.init_process_group("nccl")
    trained, _ = fit(torch.nn.Linear(4, 4), build_loader())
    if dist.get_rank() == 0:
        torch.save(trained.state_dict(), "final.pth")
    dist.destroy_process_group()
"""

_LOGGER = """\
import torch


class RunLogger:
    def __init__(self, path):
        self.path = path

    def save_checkpoint(self, model, step, optimizer):
        torch.save(
            {"state_dict": model.state_dict(), "step": step, "opt": optimizer.state_dict()},
            self.path,
        )
"""

_KEYWORD_SAVE = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from run_logger import RunLogger


class Pretrainer:
    def __init__(self, net, loader):
        dist.init_process_group("nccl")
        self.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        self.raw_model = net.cuda()
        self.model = DDP(self.raw_model, device_ids=[self.local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.loader = loader
        self.logger = RunLogger("ckpt.pt")

    def run(self):
        for step, batch in enumerate(self.loader):
            self.optimizer.zero_grad()
            self.model(batch).mean().backward()
            self.optimizer.step()
            if dist.get_rank() == 0 and step % 100 == 0:
                self.logger.save_checkpoint({call_args})
        dist.destroy_process_group()


if __name__ == "__main__":
    Pretrainer(build_net(), build_loader()).run()
"""


def _findings(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, str, int]]:
    (tmp_path / ".git").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return [(Path(f.path).name, f.code, f.line) for f in report.findings if f.code == "GT006"]


@pytest.mark.parametrize(
    ("saved", "line"),
    [("model", 27), ("model.state_dict()", 27), ('{"net": model.state_dict()}', 27)],
)
def test_trainer_train_returns_the_wrapper(tmp_path: Path, saved: str, line: int) -> None:
    """``model = trainer.train(n)`` where ``train`` returns ``self.model``, the DDP wrapper."""
    script = _TRAINER.replace("{returned}", "self.model").replace("{saved}", saved)
    assert _findings(tmp_path, {"train.py": script}) == [("train.py", "GT006", line)]


def test_trainer_train_returns_the_module(tmp_path: Path) -> None:
    """``return self.model.module``: the caller saves the plain module."""
    script = _TRAINER.replace("{returned}", "self.model.module").replace(
        "{saved}", "model.state_dict()"
    )
    assert _findings(tmp_path, {"train.py": script}) == []


def test_module_train_still_the_module(tmp_path: Path) -> None:
    """``net = DDP(...).train()`` is still the wrapper (``nn.Module.train`` returns self)."""
    script = _FIT_FUNCTION.replace(
        "wrapped = DistributedDataParallel(net.cuda(), device_ids=[local_rank])",
        "wrapped = DistributedDataParallel(net.cuda(), device_ids=[local_rank]).train()",
    )
    assert _findings(tmp_path, {"train.py": script}) == [("train.py", "GT006", 24)]


def test_function_returning_the_wrapper_in_a_tuple(tmp_path: Path) -> None:
    assert _findings(tmp_path, {"train.py": _FIT_FUNCTION}) == [("train.py", "GT006", 24)]


@pytest.mark.parametrize(
    "call_args",
    [
        "model=self.model, step=step, optimizer=self.optimizer",
        "self.model, step, optimizer=self.optimizer",
    ],
)
def test_helper_saves_the_wrapper_given_by_keyword(tmp_path: Path, call_args: str) -> None:
    script = _KEYWORD_SAVE.replace("{call_args}", call_args)
    found = _findings(tmp_path, {"pretrain.py": script, "run_logger.py": _LOGGER})
    assert found == [("pretrain.py", "GT006", 27)]


@pytest.mark.parametrize(
    "call_args",
    [
        "model=self.raw_model, step=step, optimizer=self.optimizer",
        "model=self.model.module, step=step, optimizer=self.optimizer",
        "step=step, model=self.raw_model, optimizer=self.optimizer",
    ],
)
def test_helper_given_the_plain_module(tmp_path: Path, call_args: str) -> None:
    script = _KEYWORD_SAVE.replace("{call_args}", call_args)
    assert _findings(tmp_path, {"pretrain.py": script, "run_logger.py": _LOGGER}) == []
