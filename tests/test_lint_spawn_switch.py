"""``gpu-training lint`` ``GT007``: a switch that both spawns the ranks and creates the group.

Issue 33, the third random sample of findings (``benchmarks/lint_ddpsample3_triage.csv``): a
training function creates the group under ``if config.distributed.data_parallel:`` and saves
under ``if not config.distributed.data_parallel or dist.get_rank() == 0:``; ``main`` runs it
through ``mp.spawn`` (a helper of another module) when the switch is on and calls it directly,
``train(0, 1, config)``, when it is off. That direct call "creates the group" through
``train``, so the switch looked like one whose both sides create it, and the guard was no
guard: ``GT007`` at the save and at both call sites of the saving helper. A call that creates
the group only under ``if flag:`` does not on the side where the flag is off; the switch is
then the group's (its ``not`` holds in one process), and the guard is rank 0's. A save under
``not flag or ...`` where the group is created whatever the flag stays reported. Minimal reproductions
written here.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_UTILS = """\
import torch
import torch.multiprocessing as mp


def save_master_checkpoint(epoch, model, ckpt_name):
    torch.save({"epoch": epoch, "model_state_dict": model.state_dict()}, ckpt_name)


def start_dist_train(train_fn, world_size, config):
    mp.spawn(train_fn, args=(world_size, config), nprocs=world_size, join=True)
"""

_TRAIN = """\
import torch
import torch.distributed as dist

from utils import save_master_checkpoint, start_dist_train


def train(local_rank, world_size, config):
    if config.distributed.data_parallel:
        dist.init_process_group("nccl", rank=local_rank, world_size=world_size)
    model = torch.nn.Linear(2, 2)
    for epoch in range(3):
        if not config.distributed.data_parallel or dist.get_rank() == 0:
            save_master_checkpoint(epoch, model, f"ckpt{epoch}.pt")


def main(config):
    if config.distributed.data_parallel:
        start_dist_train(train, config.distributed.world_size, config)
    else:
        train(0, 1, config)


if __name__ == "__main__":
    main(None)
"""


def test_a_guard_on_the_switch_that_spawns_and_creates_the_group_is_rank_0s(
    tmp_path: Path,
) -> None:
    files = {"utils.py": _UTILS, "train_multi_gpu.py": _TRAIN}
    assert repo_findings(tmp_path, files, "GT007") == []


def test_a_guard_on_a_flag_that_creates_nothing_stays_reported(tmp_path: Path) -> None:
    """The group created whatever the flag: ``not config.verbose`` holds on every rank."""
    train = _TRAIN.replace(
        "    if config.distributed.data_parallel:\n        dist.init_process_group(",
        "    dist.init_process_group(",
    ).replace("not config.distributed.data_parallel or", "not config.verbose or")
    assert "or dist.get_rank() == 0" in train and "    dist.init_process_group(" in train
    files = {"utils.py": _UTILS, "train_multi_gpu.py": train}
    assert len(repo_findings(tmp_path, files, "GT007")) >= 1
