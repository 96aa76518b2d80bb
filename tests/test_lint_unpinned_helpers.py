"""``gpu-training lint`` ``GT002``: the current GPU used before DeepSpeed pins the process, and
by the project's helpers of a script that never pins it.

Issue 33, set 19. (1) A DeepSpeed script that declares the launcher's ``--local_rank`` and
moves its model with ``.cuda()`` before ``deepspeed.initialize`` (whose engine is what calls
``set_device(local_rank)``): under ``deepspeed`` with two GPUs both ranks first load the model
onto ``cuda:0``. (2) A script that creates its group with ``init_process_group`` and no
``set_device``, moves its batches to ``cuda:<rank>``, and calls a helper module whose
``DEVICE = torch.device("cuda" ...)`` places the model and masks on the current GPU,
``cuda:0`` for every rank. Minimal reproductions written here, with variants (``.to("cuda")``,
``torch.zeros(..., device=DEVICE)``, a string constant, ``mp.spawn`` and torchrun); not
reported: the same scripts pinning the device, a move after ``deepspeed.initialize``, a
DeepSpeed script with no launcher argument run as one process, and helpers that take the
rank's device as an argument.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_DEEPSPEED = """\
import argparse

import deepspeed
import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    model = build_model()
    model = {move}
    engine, _, loader, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=build_dataset(),
        config="ds_config.json",
    )
    for _ in range(args.epochs):
        for batch in loader:
            loss = engine(batch.to(engine.device)).mean()
            engine.backward(loss)
            engine.step()


if __name__ == "__main__":
    main()
"""

_HELPERS = """\
import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_masks(seq_len):
    return torch.zeros((seq_len, seq_len), device=DEVICE).bool()


def build(vocab):
    net = torch.nn.Embedding(vocab, 64)
    return net.to(DEVICE), torch.optim.Adam(net.parameters(), lr=1e-4)
"""

_SPAWNED = """\
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from {helpers} import build, make_masks


def worker(rank, world_size, loader):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
{pin}    model, optimizer = build(1000)
    model = DDP(model, device_ids=[rank])
    for src in loader:
        src = src.to(rank)
        mask = make_masks(src.shape[0])
        optimizer.zero_grad()
        model(src).masked_fill(mask[0, 0], 0).sum().backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, build_loader()), nprocs=2)
"""

_TORCHRUN = """\
import os

import torch
import torch.distributed as dist

import tools


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    model = tools.load_net().cuda(local_rank)
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x in tools.batches():
        opt.zero_grad()
        net(x.cuda(local_rank) + tools.{noise}(x.shape)).sum().backward()
        opt.step()


main()
"""

_TOOLS = """\
import torch

GPU = "cuda"


def load_net():
    return torch.nn.Linear(8, 8)


def noise(shape):
    return torch.randn(shape).to(GPU)


def noise_on(shape, device):
    return torch.randn(shape, device=device)


def batches():
    return [torch.randn(4, 8)]
"""


def _gt002(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT002")


@pytest.mark.parametrize("move", ["model.cuda()", 'model.to("cuda")', "model.half().cuda()"])
def test_deepspeed_script_moves_its_model_before_initialize(tmp_path: Path, move: str) -> None:
    text = _DEEPSPEED.replace("{move}", move)
    assert _gt002(tmp_path, {"finetune.py": text}) == [("finetune.py", 13)]


def test_deepspeed_script_pinning_itself(tmp_path: Path) -> None:
    text = _DEEPSPEED.replace("{move}", "model.cuda()").replace(
        "    model = build_model()\n",
        "    torch.cuda.set_device(args.local_rank)\n    model = build_model()\n",
    )
    assert _gt002(tmp_path, {"finetune.py": text}) == []


def test_deepspeed_script_without_the_launcher_argument(tmp_path: Path) -> None:
    """No ``--local_rank``, no launcher variable, no launch script: one process."""
    text = _DEEPSPEED.replace("{move}", "model.cuda()").replace(
        '    parser.add_argument("--local_rank", type=int, default=0)\n', ""
    )
    assert _gt002(tmp_path, {"finetune.py": text}) == []


def test_deepspeed_move_after_initialize(tmp_path: Path) -> None:
    text = _DEEPSPEED.replace("{move}", "model").replace(
        "    for _ in range(args.epochs):\n",
        "    model.cuda()\n    for _ in range(args.epochs):\n",
    )
    assert _gt002(tmp_path, {"finetune.py": text}) == []


def test_spawned_workers_with_a_helper_on_the_current_gpu(tmp_path: Path) -> None:
    text = _SPAWNED.replace("{helpers}", "helpers").replace("{pin}", "")
    assert _gt002(tmp_path, {"multi.py": text, "helpers.py": _HELPERS}) == [("multi.py", 14)]


def test_spawned_workers_pinned(tmp_path: Path) -> None:
    text = _SPAWNED.replace("{helpers}", "helpers").replace(
        "{pin}", "    torch.cuda.set_device(rank)\n"
    )
    assert _gt002(tmp_path, {"multi.py": text, "helpers.py": _HELPERS}) == []


def test_helper_with_the_rank_device_given(tmp_path: Path) -> None:
    helpers = _HELPERS.replace("def make_masks(seq_len):", "def make_masks(seq_len, DEVICE=0):")
    helpers = helpers.replace("def build(vocab):", "def build(vocab, DEVICE=0):")
    text = _SPAWNED.replace("{helpers}", "helpers").replace("{pin}", "")
    assert _gt002(tmp_path, {"multi.py": text, "helpers.py": helpers}) == []


def test_torchrun_script_with_a_helper_string_device(tmp_path: Path) -> None:
    text = _TORCHRUN.replace("{noise}", "noise")
    assert _gt002(tmp_path, {"train.py": text, "tools.py": _TOOLS}) == [("train.py", 10)]


def test_torchrun_script_whose_helpers_take_the_device(tmp_path: Path) -> None:
    text = _TORCHRUN.replace("{noise}", "noise_on").replace("(x.shape)", "(x.shape, local_rank)")
    assert _gt002(tmp_path, {"train.py": text, "tools.py": _TOOLS}) == []
