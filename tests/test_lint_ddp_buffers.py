"""``gpu-training lint``: a DDP model's forward on rank 0 only is a collective when the
module has buffers (``GT009``).

``DistributedDataParallel`` broadcasts the module's buffers (BatchNorm's running statistics, a
registered buffer) from rank 0 at the first forward after a training step
(``broadcast_buffers=True`` by default). Evaluating the wrapped model on rank 0 after the
epoch's training enters a broadcast the other ranks never join. Held-back sets 12, 14 and 20
each missed one or two such hangs (issue 33, round 21). The first test shows the premise on
2 gloo ranks with this torch; the others are minimal reproductions of the patterns, each
reported before the change as nothing.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from tests.dist_harness import run_ranks

from gpu_training.diagnostics.lint.report import lint_paths

_HEAD = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

"""

_NET = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.norm = {norm}
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        return self.out(self.norm(self.fc(x)))


"""

_MAIN = """\
def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(Net(){extra})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for _ in range(4):
            loss = model(torch.randn(16, 4)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
        if rank == 0:
            with torch.no_grad():
                {evaluate}
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def _script(norm: str = "nn.BatchNorm1d(8)", extra: str = "", evaluate: str = "") -> str:
    evaluate = evaluate or "model(torch.randn(16, 4))"
    return _HEAD + _NET.format(norm=norm) + _MAIN.format(extra=extra, evaluate=evaluate)


def _gt009(root: Path) -> list[tuple[str, int, str]]:
    report = lint_paths([root])
    assert not report.errors, report.errors
    return [(Path(f.path).name, f.line, f.detail) for f in report.findings if f.code == "GT009"]


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / ".git").mkdir(parents=True)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# --- the premise, on this torch --------------------------------------------------------------


def _rank0_evaluates(norm: bool, evaluate_first: bool) -> str:
    """Trains a DDP model for 2 epochs; rank 0 alone runs a no_grad forward after (or before)
    each epoch's training; the others wait in a barrier. Returns "ok" or the error."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=6))
    rank = dist.get_rank()
    torch.manual_seed(0)
    middle = nn.BatchNorm1d(8) if norm else nn.ReLU()
    model = DDP(nn.Sequential(nn.Linear(4, 8), middle, nn.Linear(8, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def evaluate() -> None:
        if rank == 0:
            with torch.no_grad():
                model(torch.randn(16, 4))

    try:
        for _ in range(2):
            if evaluate_first:
                evaluate()
            for _ in range(3):
                model(torch.randn(16, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
            if not evaluate_first:
                evaluate()
        dist.barrier()
        outcome = "ok"
    except RuntimeError as err:  # gloo's timeout: the broadcast or the barrier never matched
        outcome = f"error: {str(err)[:80]}"
    dist.destroy_process_group()
    return outcome


@pytest.mark.parametrize(
    ("norm", "evaluate_first", "hangs"),
    [(True, False, True), (False, False, False), (True, True, False)],
    ids=["batchnorm-after-training", "no-buffers", "batchnorm-before-training"],
)
def test_the_premise_holds_on_two_gloo_ranks(norm: bool, evaluate_first: bool, hangs: bool) -> None:
    outcomes = run_ranks(_rank0_evaluates, 2, args=(norm, evaluate_first), timeout=60)
    assert any(o != "ok" for o in outcomes) is hangs, outcomes


# --- what lint reports ------------------------------------------------------------------------


def test_rank0_evaluation_of_a_batchnorm_ddp_model_is_reported(tmp_path: Path) -> None:
    script = _script()
    found = _gt009(_repo(tmp_path, {"train.py": script}))
    line = _line_of(script, "                model(torch.randn(16, 4))")
    assert [(n, ln) for n, ln, _ in found] == [("train.py", line)]
    assert "BatchNorm1d in Net" in found[0][2]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"norm": "nn.LayerNorm(8)"},  # no buffers: DDP's forward broadcasts nothing
        {"extra": ", broadcast_buffers=False"},
        {"evaluate": "model.module(torch.randn(16, 4))"},  # the unwrapped model
    ],
    ids=["no-buffers", "broadcast-off", "unwrapped"],
)
def test_no_broadcast_no_finding(tmp_path: Path, kwargs: dict[str, str]) -> None:
    assert _gt009(_repo(tmp_path, {"train.py": _script(**kwargs)})) == []


def test_evaluation_before_the_epochs_training_is_matched(tmp_path: Path) -> None:
    # the others' next training forward broadcasts too: rank 0's broadcast is matched
    script = _script().replace(
        "        for _ in range(4):\n"
        "            loss = model(torch.randn(16, 4)).sum()\n"
        "            loss.backward()\n"
        "            opt.step()\n"
        "            opt.zero_grad()\n"
        "        if rank == 0:\n"
        "            with torch.no_grad():\n"
        "                model(torch.randn(16, 4))\n",
        "        if rank == 0:\n"
        "            with torch.no_grad():\n"
        "                model(torch.randn(16, 4))\n"
        "        for _ in range(4):\n"
        "            loss = model(torch.randn(16, 4)).sum()\n"
        "            loss.backward()\n"
        "            opt.step()\n"
        "            opt.zero_grad()\n",
    )
    assert script != _script()
    assert _gt009(_repo(tmp_path, {"train.py": script})) == []
    # the same with an evaluation loop of its own: the epoch loop around it still decides
    looped = script.replace(
        "                model(torch.randn(16, 4))\n        for _ in range(4):",
        "                for _ in range(2):\n"
        "                    model(torch.randn(16, 4))\n"
        "        for _ in range(4):",
    )
    assert looped != script
    assert _gt009(_repo(tmp_path / "looped", {"train.py": looped})) == []


_HELPER_TRAIN = """\
import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

from engine import evaluate

MODELS = {"r18": torchvision.models.resnet18, "r50": torchvision.models.resnet50}


def main(name, loader):
    dist.init_process_group("nccl")
    model = MODELS[name](num_classes=10).cuda()
    model = DDP(model)
    for epoch in range(3):
        for x, y in loader:
            model(x).sum().backward()
        if dist.get_rank() == 0:
            evaluate(loader, model)
    dist.destroy_process_group()
"""

_ENGINE = """\
import torch


def evaluate(loader, net):
    net.eval()
    with torch.no_grad():
        for x, _ in loader:
            net(x)
"""


def test_a_helper_that_runs_the_forward_is_reported_at_its_call(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"train.py": _HELPER_TRAIN, "engine.py": _ENGINE})
    found = _gt009(root)
    assert [(n, ln) for n, ln, _ in found] == [("train.py", 19)]
    assert "evaluate() runs its forward at engine.py:8" in found[0][2]
    assert "resnet" in found[0][2]


_MODELS = """\
import torch
import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        {buffer}

    def forward(self, x):
        return self.fc(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()

    def forward(self, x):
        return self.encoder(x)
"""

_TRAIN_IMPORTED = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from models import Model


def main(loader):
    dist.init_process_group("nccl")
    model = DDP(Model().cuda())
    for x in loader:
        model(x).sum().backward()
    if dist.get_rank() == 0:
        model(x)
    dist.barrier()
"""


@pytest.mark.parametrize(
    ("buffer", "reported"),
    [
        ('self.register_buffer("scale", torch.ones(8))', True),
        # nanoGPT's shape: a buffer only on old torch versions, not known from the code
        (
            'if not hasattr(torch.nn.functional, "sdpa"):\n            self.register_buffer("m", torch.ones(8))',
            False,
        ),
    ],
    ids=["registered", "conditional"],
)
def test_a_buffer_in_a_class_another_file_builds(
    tmp_path: Path, buffer: str, reported: bool
) -> None:
    root = _repo(
        tmp_path, {"train.py": _TRAIN_IMPORTED, "models.py": _MODELS.format(buffer=buffer)}
    )
    found = _gt009(root)
    assert [(n, ln) for n, ln, _ in found] == ([("train.py", 14)] if reported else [])
    if reported:
        assert "register_buffer in Encoder (models.py:9)" in found[0][2]


_WRAPS_ITS_PARAMETER = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def do_train(cfg, model, loader):
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) if cfg.sync_bn else model
    model = DDP(model.cuda())
    for epoch in range(cfg.epochs):
        for x in loader:
            model(x).sum().backward()
        if dist.get_rank() == 0:
            model.eval()
            with torch.no_grad():
                model(x)
        dist.barrier()
"""

_BUILDS_AND_PASSES = """\
import torch.distributed as dist
import torch.nn as nn

from processor import do_train


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.bottleneck = {norm}

    def forward(self, x):
        return self.bottleneck(self.fc(x))


def main(cfg, loader):
    dist.init_process_group("nccl")
    do_train(cfg, Backbone(), loader)
"""


@pytest.mark.parametrize(
    ("norm", "reported"), [("nn.BatchNorm1d(8)", True), ("nn.LayerNorm(8)", False)]
)
def test_a_model_wrapped_where_it_is_passed_in(tmp_path: Path, norm: str, reported: bool) -> None:
    # TransReID's shape (found missed on unseen code, benchmarks/lint_ddp_buffers_check.md):
    # train.py builds the model, processor.do_train wraps its parameter in DDP, through
    # SyncBatchNorm.convert_sync_batchnorm on one path
    files = {
        "processor.py": _WRAPS_ITS_PARAMETER,
        "train.py": _BUILDS_AND_PASSES.format(norm=norm),
    }
    found = _gt009(_repo(tmp_path, files))
    assert [(n, ln) for n, ln, _ in found] == ([("processor.py", 15)] if reported else [])
    if reported:
        assert "BatchNorm1d in Backbone (train.py:11)" in found[0][2]


def test_sync_batchnorm_keeps_the_buffers(tmp_path: Path) -> None:
    # Taited's shape: the model converted to SyncBatchNorm before DDP wraps it
    script = _script().replace(
        "    model = DDP(Net())\n",
        "    model = nn.SyncBatchNorm.convert_sync_batchnorm(Net())\n    model = DDP(model)\n",
    )
    assert "convert_sync_batchnorm" in script
    found = _gt009(_repo(tmp_path, {"train.py": script}))
    assert len(found) == 1 and "BatchNorm1d in Net" in found[0][2]
