"""``gpu-training lint``: four ways projects keep work to one process that the lint did not
read (``GT007``, ``GT003``).

Issue 33, the random sample of findings over 111 DDP repositories
(``benchmarks/lint_ddpsample_triage.csv``):

- **a rank-0 predicate written as a flag** (an HPC helper repository): ``flag_save = True``;
  ``if dist.is_initialized(): if dist.get_rank() != 0: flag_save = False``; ``return
  flag_save``. It is ``get_rank() == 0 if is_initialized() else True``, a rank-0 guard with its
  one-process fallback (``flag_returns.flag_expression``); the lint read the returned name,
  bound to two constants, as no guard (2 false findings);
- **the ranks spawned by a helper of another module** (a particle-physics repository):
  ``main()`` writes the run's config, then calls ``device_agnostic_run(config, world_size)``,
  whose ``mp.spawn(run, ...)`` starts the ranks (or calls ``run`` itself on one GPU). What
  ``main`` does before runs once, in the launching process; the lint read ``main`` as a rank
  because the helper creates the group on its one-GPU branch (2 false findings). A function
  that spawns, itself or through what it calls, now makes its callers launchers
  (``Summary.spawns``), as a direct ``mp.spawn`` already did;
- **a data module with both loaders** (a person-search repository): ``build_train_loader``
  (``shuffle=True``) for the one-process ``train.py``, ``build_train_loader_ddp`` (with a
  ``DistributedSampler``) that nothing calls. The sampler made the module distributed and its
  plain loader a ``GT003`` (2 false findings); a function only files without a group call now
  builds its loader for one process (``lone_callers.called_only_alone``);
- **a rank that holds a word**: the particle-physics repository's CPU run passes
  ``rank = "cpu"`` to the worker, which saves under ``rank == 0 or rank == "cpu"``; like
  ``rank == -1`` the word means "no ranks" (1 false finding). A number written as text
  (``"0"``, ``"1"``) is still a rank.

Minimal reproductions written here, with the variants that stay reported.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_FLAG = """\
import torch.distributed as dist


def get_ddp_save_flag():
    flag_save = True
    if dist.is_initialized():
        if dist.get_rank() != 0:
            flag_save = False
    return flag_save
"""

_BACKUP = """\
import os
import shutil

from utils.dist_training import get_ddp_save_flag


def backup_code(logdir):
    if get_ddp_save_flag():
        os.makedirs(logdir, exist_ok=True)
        shutil.copytree("utils", os.path.join(logdir, "utils"))
"""

_MAIN = """\
import os
import torch
import torch.distributed as dist
from utils.arg_parser import backup_code

if __name__ == "__main__":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    backup_code("runs")
    with open("log.txt", "w") as f:
        f.write("x")
    dist.destroy_process_group()
"""


def _flag_files(flag: str = _FLAG) -> dict[str, str]:
    return {
        "utils/__init__.py": "",
        "utils/dist_training.py": flag,
        "utils/arg_parser.py": _BACKUP,
        "main.py": _MAIN,
    }


def test_a_flag_cleared_off_rank_0_guards_the_write(tmp_path: Path) -> None:
    # the unguarded log file of main.py stays the one finding
    assert repo_findings(tmp_path, _flag_files(), "GT007") == [("main.py", 10)]


def test_a_flag_cleared_on_every_rank_of_a_group_guards_nothing(tmp_path: Path) -> None:
    flag = _FLAG.replace("        if dist.get_rank() != 0:\n            flag_save = False\n", "")
    flag = flag.replace("    if dist.is_initialized():\n", "    if dist.get_rank() > 99:\n")
    flag = flag.replace("    return flag_save", "        flag_save = False\n    return flag_save")
    found = repo_findings(tmp_path, _flag_files(flag), "GT007")
    assert ("arg_parser.py", 10) in found and ("main.py", 10) in found


def test_a_flag_set_in_a_loop_is_not_read(tmp_path: Path) -> None:
    flag = _FLAG.replace(
        "    if dist.is_initialized():\n",
        "    for _ in range(1):\n        flag_save = dist.get_rank() > 0\n    if dist.is_initialized():\n",
    )
    assert ("arg_parser.py", 10) in repo_findings(tmp_path, _flag_files(flag), "GT007")


_TRAINING = """\
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world_size, outdir):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    if rank == 0:
        torch.save({}, f"{outdir}/m.pt")
    dist.destroy_process_group()


def device_agnostic_run(world_size, outdir):
    if world_size > 1:
        mp.spawn(run, args=(world_size, outdir), nprocs=world_size, join=True)
    else:
        run(0, world_size, outdir)
"""

_PIPELINE = """\
import json
from training import device_agnostic_run


def main():
    outdir = "exp"
    with open(f"{outdir}/config.json", "w") as f:
        json.dump({}, f)
    device_agnostic_run(4, outdir)


if __name__ == "__main__":
    main()
"""


def test_what_runs_before_a_spawning_helper_runs_once(tmp_path: Path) -> None:
    files = {"training.py": _TRAINING, "pipeline.py": _PIPELINE}
    assert repo_findings(tmp_path, files, "GT007") == []


def test_a_helper_that_only_creates_the_group_keeps_its_caller_a_rank(tmp_path: Path) -> None:
    training = _TRAINING.replace(
        "        mp.spawn(run, args=(world_size, outdir), nprocs=world_size, join=True)\n"
        "    else:\n",
        "        pass\n",
    ).replace("        run(0, world_size, outdir)", "    run(0, world_size, outdir)")
    files = {"training.py": training, "pipeline.py": _PIPELINE}
    assert repo_findings(tmp_path, files, "GT007") == [("pipeline.py", 7)]


_DATASETS = """\
import torch
from torch.utils.data import DistributedSampler


def build_train_loader(data):
    return torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, drop_last=True)


def build_train_loader_ddp(data):
    sampler = DistributedSampler(data)
    return torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler), sampler
"""

_ONE_PROCESS = """\
import torch
from datasets import build_train_loader

if __name__ == "__main__":
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in build_train_loader(list(range(8))):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
"""


def test_a_loader_only_a_one_process_script_builds(tmp_path: Path) -> None:
    files = {"datasets.py": _DATASETS, "train.py": _ONE_PROCESS}
    assert repo_findings(tmp_path, files, "GT003") == []


def test_the_same_loader_built_by_a_distributed_script(tmp_path: Path) -> None:
    script = _ONE_PROCESS.replace(
        'if __name__ == "__main__":\n',
        'if __name__ == "__main__":\n    torch.distributed.init_process_group("gloo")\n',
    )
    files = {"datasets.py": _DATASETS, "train.py": script}
    assert ("datasets.py", 6) in repo_findings(tmp_path, files, "GT003")


_CPU_RANK = """\
import json
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def save_hps(outdir):
    with open(f"{outdir}/hps.json", "w") as f:
        json.dump({}, f)


def run(rank, world_size, outdir):
    if rank != "cpu":
        dist.init_process_group("nccl", rank=int(rank), world_size=world_size)
        torch.cuda.set_device(rank)
    if (rank == 0) or (rank == "cpu"):
        save_hps(outdir)
    if rank != "cpu":
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2, "out"), nprocs=2)
"""


def test_a_rank_that_holds_a_word_is_a_run_without_ranks(tmp_path: Path) -> None:
    # the particle-physics repository's `rank == 0 or rank == "cpu"` (its CPU run)
    assert repo_findings(tmp_path, {"train.py": _CPU_RANK}, "GT007") == []
    # the group's rank is the spawn index (`rank=int(rank)`): one machine, no second node
    assert repo_findings(tmp_path, {"train.py": _CPU_RANK}, "GT017") == []
    # a rank read from the environment as text: "0" is rank 0, "1" another rank
    other = _CPU_RANK.replace('(rank == "cpu")', '(str(rank) == "1")')
    assert repo_findings(tmp_path, {"train.py": other}, "GT007") == [("train.py", 8)]
