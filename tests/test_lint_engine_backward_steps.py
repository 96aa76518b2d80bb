"""``gpu-training lint`` GT013: an engine's own ``backward(loss)`` is no DDP micro-batch.

A loop shared by a DDP path and a DeepSpeed path tells the engine apart at run time
(``hasattr(model, "backward")``) and calls ``model.backward(loss); model.step()`` on it: the
engine reduces and updates only at its own accumulation boundary, so no ``no_sync()`` is
missing there (issue 33, set 20: a training loop whose engine branch was read as DDP
accumulation). The DDP branch of the same loop keeps its finding. Minimal reproductions
written here.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths

_LOOP = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, loader, optimizer, accumulation):
    for i, (x, y) in enumerate(loader):
        if {test}:
            loss = model(x, y)
            {engine_backward}
            {engine_step}
        else:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            if (i + 1) % accumulation == 0:
                optimizer.step()
                optimizer.zero_grad()


def main():
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(4, 4).cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, [], optimizer, 4)


if __name__ == "__main__":
    main()
"""


def _gt013(tmp_path: Path, **parts: str) -> list[int]:
    (tmp_path / ".git").mkdir(exist_ok=True)
    path = tmp_path / "train.py"
    path.write_text(_LOOP.format(**parts))
    return sorted(f.line for f in lint_paths([path]).findings if f.code == "GT013")


def test_an_engine_that_takes_the_loss_and_steps_itself_is_not_reported(tmp_path: Path) -> None:
    found = _gt013(
        tmp_path,
        test='hasattr(model, "backward")',
        engine_backward="model.backward(loss)",
        engine_step="model.step()",
    )
    assert found == [14]  # the DDP branch only


def test_an_engine_named_otherwise_and_stepped_at_the_boundary_is_not_reported(
    tmp_path: Path,
) -> None:
    found = _gt013(
        tmp_path,
        test="getattr(model, 'is_engine', False)",
        engine_backward="model.backward(loss, retain_graph=False)",
        engine_step="model.step() if (i + 1) % accumulation == 0 else None",
    )
    assert found == [14]


def test_a_backward_whose_receiver_never_steps_is_still_reported(tmp_path: Path) -> None:
    found = _gt013(
        tmp_path,
        test="i < 0",
        engine_backward="loss.backward(torch.ones_like(loss))",
        engine_step="pass",
    )
    assert found == [10, 14]


_EPOCHS = """\
import deepspeed
import torch


class Trainer:
    def __init__(self, model, loader, epochs, ds_config):
        torch.distributed.init_process_group("nccl")
        self.model, self.loader, self.epochs, self.ds_config = model, loader, epochs, ds_config
        self.optimizer = torch.optim.AdamW(model.parameters())

    def train_deepspeed(self):
        model_engine, _, _, _ = deepspeed.initialize(model=self.model, config=self.ds_config)
        for epoch in range(self.epochs):
            for batch in self.loader:
                loss = model_engine(batch)
                model_engine.backward(loss)
                model_engine.step()

    def train(self, use_deepspeed):
        if use_deepspeed:
            return self.train_deepspeed()
        self.model = torch.nn.parallel.DistributedDataParallel(self.model)
        for batch in self.loader:
            self.model(batch).sum().backward()
            self.optimizer.step()
        self.optimizer.zero_grad()
        self.optimizer.step()
"""


def test_an_engine_that_steps_every_pass_is_no_micro_batch_loop(tmp_path: Path) -> None:
    """Issue 33, held-back set 23: a DeepSpeed epoch loop whose batch loop calls
    ``model_engine.backward(loss); model_engine.step()``, in a method called as ``return
    self.train_deepspeed()`` from a function whose other path steps an optimizer further down:
    the epoch loop was read as the micro-batches of that one step."""
    (tmp_path / "train.py").write_text(_EPOCHS)
    found = [f for f in lint_paths([tmp_path / "train.py"]).findings if f.code == "GT013"]
    assert found == []
