"""A user task that fails on purpose, for the fault matrix of tests/test_faults.py.

A job file names it with import strings (``tests/scripts`` on ``PYTHONPATH``)::

    task: {model: "fault_task:build_model", data: "fault_task:build_data"}

and tests/scripts/fault_helpers.py (the helper-API loop) imports it too. What fails, where and
on which rank comes from the environment:

* ``FAULT_KIND``: ``raise`` (a ``RuntimeError``), ``kill`` (SIGKILL of this rank, or of its
  DataLoader worker), ``stall`` (sleeps for ten minutes) or ``mismatch`` (a ``broadcast``
  that no other rank calls: they are in another collective);
* ``FAULT_WHERE``: ``step`` (the model's forward in training, at optimizer step
  ``FAULT_STEP``), ``save`` (the first ``state_dict()`` of a checkpoint save), ``eval``
  (the model's forward in evaluation) or ``data`` (the dataset's ``__getitem__``, in a
  DataLoader worker when the loader has one);
* ``FAULT_RANK``: the rank that fails (default 1);
* ``STEP_SLEEP``: seconds each training forward sleeps (no fault: a job slow enough to be
  signalled mid-run).

Just before the fault, the failing process prints ``FAULT_AT <unix time> <kind> <where> rank
<R>`` (one write: ranks share torchrun's stdout).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

FEATURES, CLASSES, SAMPLES = 8, 4, 256
FAULT_MESSAGE = "planted fault"


def _plan() -> tuple[str, str, int, int]:
    return (
        os.environ.get("FAULT_KIND", ""),
        os.environ.get("FAULT_WHERE", ""),
        int(os.environ.get("FAULT_RANK", "1")),
        int(os.environ.get("FAULT_STEP", "3")),
    )


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def fault(where: str) -> None:
    """The planted fault, on the planned rank, if ``where`` is the planned place."""
    kind, planned, rank, _ = _plan()
    worker = torch.utils.data.get_worker_info() is not None
    if planned != where or (_rank() != rank):
        return
    # straight to fd 1: a library may have replaced sys.stdout, and SIGKILL follows at once
    os.write(1, f"FAULT_AT {time.time():.3f} {kind} {where} rank {rank}\n".encode())
    if kind == "raise":
        raise RuntimeError(f"{FAULT_MESSAGE}: {kind} in {where} on rank {rank}")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stall":
        time.sleep(600)
    if kind == "mismatch" and not worker:
        import torch.distributed as dist

        dist.broadcast(torch.zeros(3), src=0)  # the other ranks are in another collective


class Block(nn.Module):
    """One layer: the FSDP unit."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class FaultyNet(nn.Module):
    """A small MLP whose forward (train or eval) and ``state_dict`` may hold the fault."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, 16)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.out = nn.Linear(16, CLASSES)
        self.train_calls = 0
        self.saves = 0
        self._register_state_dict_hook(FaultyNet._on_state_dict)

    @staticmethod
    def _on_state_dict(module: nn.Module, state: Any, prefix: str, local: Any) -> None:
        assert isinstance(module, FaultyNet)
        module.saves += 1
        if module.saves == 1 and not prefix:
            fault("save")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.train_calls += 1
            time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
            if self.train_calls == _plan()[3]:
                fault("step")
        else:
            fault("eval")
        h = torch.relu(self.inp(x))
        for block in self.blocks:
            h = block(h)
        return self.out(h)


class FaultyData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random classification data; the ``FAULT_STEP``-th batch's first item holds the fault
    (of the training set: the validation set is built with ``faulty=False``)."""

    def __init__(self, n: int, seed: int, batch: int, faulty: bool = True) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = torch.randint(0, CLASSES, (n,), generator=g)
        self.reads = 0
        self.trigger = batch * (_plan()[3] - 1) + 1 if faulty else -1

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads += 1
        if self.reads == self.trigger:
            fault("data")
        return self.x[i], self.y[i]


def build_model() -> nn.Module:
    """The model factory of the job file."""
    return FaultyNet()


def build_data(batch: int = 4) -> tuple[Dataset[Any], Dataset[Any]]:
    """The data factory: (train, val)."""
    return FaultyData(SAMPLES, 0, batch), FaultyData(32, 1, batch, faulty=False)
