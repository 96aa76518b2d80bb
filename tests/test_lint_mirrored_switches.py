"""``gpu-training lint``: the two branches of a script that runs alone or in a group.

Issue 33, the random sample of findings over 111 DDP repositories
(``benchmarks/lint_ddpsample_triage.csv``). Scripts of a whole family of re-identification
repositories, and a PyTorch MNIST DDP example, end an epoch with

    if cfg.MODEL.DIST_TRAIN:            # or `if args.distributed:`
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), path)
    else:
        torch.save(model.state_dict(), path)

where the switch also decides, earlier, whether the model is wrapped in DDP. The ``else`` runs
only without a group: one process writes there (no ``GT007``), and the model it saves was never
wrapped (no ``GT006``). The lint reported both (4 of the 41 false findings of the sample, in
three repositories). Two readings now: the branches mirror each other around a rank guard, so
the switch's ``else`` is one process (``switches._mirrors``); and a model wrapped on one branch
of a test is not the wrapper on the other branch of the same, unchanged test
(``saved_wrappers._wrapped_on_other_side``). Minimal reproductions written here, with the
variants that stay reported.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_PROCESSOR = """\
import os
import torch
import torch.distributed as dist


def do_train(cfg, model, loader, optimizer):
    if cfg.MODEL.DIST_TRAIN:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[cfg.LOCAL_RANK])
    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        if cfg.MODEL.DIST_TRAIN:
            if dist.get_rank() == 0:
                torch.save(model.state_dict(), os.path.join(cfg.OUTPUT_DIR, "m.pth"))
        else:
            torch.save(model.state_dict(), os.path.join(cfg.OUTPUT_DIR, "m.pth"))
"""

_TRAIN = """\
import os
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from processor import do_train
from config import cfg

if __name__ == "__main__":
    if cfg.MODEL.DIST_TRAIN:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend="nccl", init_method="env://")
    data = list(range(10))
    sampler = DistributedSampler(data, shuffle=False) if cfg.MODEL.DIST_TRAIN else None
    loader = DataLoader(data, sampler=sampler)
    model = torch.nn.Linear(2, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    do_train(cfg, model, loader, optimizer)
    dist.destroy_process_group()
"""

_FILES = {"processor.py": _PROCESSOR, "train.py": _TRAIN, "config.py": "cfg = object()\n"}


def test_the_else_of_a_mirrored_switch_is_one_process(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, _FILES, "GT007") == []


def test_the_model_saved_there_was_never_wrapped(tmp_path: Path) -> None:
    # the guarded save of the wrapper (line 16) is the true one
    assert repo_findings(tmp_path, _FILES, "GT006") == [("processor.py", 16)]


def test_an_else_that_writes_something_else_stays_reported(tmp_path: Path) -> None:
    files = dict(_FILES)
    files["processor.py"] = _PROCESSOR.replace(
        "        else:\n            torch.save(",
        "        else:\n            print('alone')\n        if True:\n            torch.save(",
    )
    assert repo_findings(tmp_path, files, "GT007") == [("processor.py", 20), ("train.py", 17)]


def test_a_switch_changed_between_the_two_tests_keeps_the_wrapper(tmp_path: Path) -> None:
    files = dict(_FILES)
    files["processor.py"] = _PROCESSOR.replace(
        "    for epoch in range(3):\n",
        "    cfg.MODEL.DIST_TRAIN = not cfg.MODEL.DIST_TRAIN\n    for epoch in range(3):\n",
    )
    assert repo_findings(tmp_path, files, "GT006") == [("processor.py", 17), ("processor.py", 19)]


_MNIST = """\
import argparse
import os
import torch
import torch.distributed as dist


def init_distributed_mode(args):
    if "RANK" not in os.environ:
        args.distributed = False
        return
    args.distributed = True
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl")


def main():
    args = argparse.ArgumentParser().parse_args()
    init_distributed_mode(args)
    model = torch.nn.Linear(2, 2).cuda()
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model(torch.ones(1, 2).cuda()).sum().backward()
    if args.distributed:
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "mnist_cnn.pt")
    else:
        torch.save(model.state_dict(), "mnist_cnn.pt")
    if args.distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def test_one_script_that_runs_alone_or_in_a_group(tmp_path: Path) -> None:
    files = {"mnist_ddp.py": _MNIST}
    assert repo_findings(tmp_path, files, "GT006") == []
    assert repo_findings(tmp_path, files, "GT007") == []
    wrapped = _MNIST.replace("model.module.state_dict()", "model.state_dict()")
    assert repo_findings(tmp_path, {"mnist_ddp.py": wrapped}, "GT006") == [("mnist_ddp.py", 26)]
