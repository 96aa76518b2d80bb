"""``gpu-training lint``: ``from utils import *`` brings the modules ``utils`` imports too.

Issue 33, the third random sample of findings over 111 DDP repositories
(``benchmarks/lint_ddpsample3_triage.csv``): a DDP GAN script starts ``from utils import *``
and ``from ddp_utils import *``, and gets ``mp`` (``torch.multiprocessing``) that way; in
``__main__`` it copies its code files to the output directory with ``save_file``, then calls
``mp.spawn(main, ...)``. The copy runs once, in the launching process (the reader: false,
``guarded``), but with ``mp`` unbound the spawn was not seen and the copy read as every rank's
write. A name the script binds itself, or one ``__all__`` leaves out, is not taken from the
star import.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_TRAIN = """\
import torch
import torch.distributed as dist

from utils import *


def main(rank, world_size, args):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = torch.nn.Linear(2, 2)
    if rank == 0:
        torch.save(model.state_dict(), "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    args = {"save": "out/"}
    save_file(args["save"], "train.py")
    mp.spawn(main, nprocs=2, args=(2, args))
"""

_UTILS = """\
import os

import torch.multiprocessing as mp
ALL

def save_file(output_dir, file_name):
    with open(os.path.join(output_dir, file_name), "w") as handle:
        handle.write(open(file_name).read())
"""


@pytest.mark.parametrize(
    ("exported", "found"),
    [
        ("", []),
        ("__all__ = ['mp', 'save_file']", []),
        ("__all__ = ['save_file']", [("train.py", 17)]),
    ],
)
def test_a_star_import_brings_its_imports(tmp_path: Path, exported: str, found: list) -> None:
    files = {"train.py": _TRAIN, "utils.py": _UTILS.replace("ALL", exported)}
    assert repo_findings(tmp_path, files, "GT007") == found


def test_a_name_the_script_binds_itself_is_its_own(tmp_path: Path) -> None:
    train = _TRAIN.replace("from utils import *", "from utils import *\n\nmp = None")
    assert repo_findings(
        tmp_path, {"train.py": train, "utils.py": _UTILS.replace("ALL", "")}, "GT007"
    ) == [("train.py", 19)]
