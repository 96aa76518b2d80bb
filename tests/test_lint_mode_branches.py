"""``gpu-training lint``: a script's modes that never make the process group run alone.

Set 22's trainers dispatch on their arguments: ``--merge_lora`` merges and saves, no
``--checkpoint`` runs a smoke test, anything else trains, and only training makes the process
group. The merge and the smoke test are one process (``python train.py --merge_lora``), so
their writes are no every-rank writes (``GT007``). The same write in a branch taken after the
group exists stays one. Minimal reproductions written here (issue 33).
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_DISPATCH = """\
import argparse

import torch
import torch.distributed as dist


def merge_and_save(args):
    model = torch.nn.Linear(2, 2)
    torch.save(model.state_dict(), args.out)


def smoke_test():
    torch.save({"ok": True}, "smoke.pt")


def train(args):
    dist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--merge_lora", action="store_true")
    parser.add_argument("--checkpoint")
    parser.add_argument("--out", default="model.pt")
    args = parser.parse_args()
    if args.merge_lora:
        merge_and_save(args)
    elif args.checkpoint is None:
        smoke_test()
    else:
        train(args)
"""

_AFTER_THE_GROUP = """\
import argparse

import torch
import torch.distributed as dist


def export(args):
    torch.save({"ok": True}, args.out)


def train(args):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), args.out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--export", action="store_true")
    parser.add_argument("--out", default="model.pt")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    if args.export:
        export(args)
    else:
        train(args)
    dist.destroy_process_group()
"""


def test_the_modes_that_never_make_the_group_write_alone(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _DISPATCH}, "GT007") == []


def test_a_mode_taken_after_the_group_exists_writes_on_every_rank(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _AFTER_THE_GROUP}, "GT007") == [("train.py", 8)]


_EXITING_MODE = """\
import sys

import deepspeed
import torch


def merge_and_save(args):
    torch.save(torch.nn.Linear(2, 2).state_dict(), "merged.pt")


def main(args):
    model = torch.nn.Linear(2, 2)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters())
    engine.save_checkpoint("ckpt")


if __name__ == "__main__":
    args = sys.argv
    if "--merge-lora" in args:
        merge_and_save(args)
        sys.exit(0)
    main(args)
"""


def test_a_mode_that_exits_before_the_group_is_made_writes_alone(tmp_path: Path) -> None:
    # set 22: `if args.merge_lora: merge_and_save(args); sys.exit(0)`, then main() makes
    # the engine (and the group) for the documented `deepspeed train_sft_deepspeed.py` run
    assert repo_findings(tmp_path, {"train.py": _EXITING_MODE}, "GT007") == []
    staying = _EXITING_MODE.replace("        sys.exit(0)\n", "")
    (tmp_path / "b").mkdir()
    assert repo_findings(tmp_path / "b", {"train.py": staying}, "GT007") == [("train.py", 8)]
