"""``gpu-training lint``: Horovod's ranks are ranks (``hvd.rank()``, ``hvd.local_rank()``).

Issue 33, the fifth random sample of findings (``benchmarks/lint_ddpsample5_triage.csv``): a
Horovod MNIST script lets rank 0 download first,

    if hvd.rank() != 0:
        hvd.barrier()              # the others wait here
    datasets.MNIST("./data", download=True)
    if hvd.rank() == 0:
        hvd.barrier()              # rank 0 releases them; they find the files

and ``GT007`` reported the download as every rank's write: ``hvd.rank()`` was read as no rank
at all, so neither test was a guard (the last note left the same pattern in a third sample's
tutorial alone). Horovod's ``rank()`` is the global rank and ``local_rank()`` the rank on the
node, as ``dist.get_rank()`` and ``LOCAL_RANK`` are. Minimal reproductions written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import horovod.torch as hvd
import torch
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets


def main():
    hvd.init()
    torch.cuda.set_device(hvd.local_rank())
BODY
    sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank())
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
    model = torch.nn.Linear(2, 2).cuda()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
SAVE


if __name__ == "__main__":
    main()
"""

_FIRST = """\
    if hvd.rank() != 0:
        hvd.barrier()
    data = datasets.MNIST("./data", train=True, download=True)
    if hvd.rank() == 0:
        hvd.barrier()
"""


def _files(body: str = "    data = list(range(64))\n", save: str = "") -> dict[str, str]:
    return {"train_hvd.py": _SCRIPT.replace("BODY\n", body).replace("SAVE\n", save)}


def test_rank_0_goes_first_with_horovods_barriers(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, _files(_FIRST), "GT007") == []


def test_a_save_under_hvd_rank_0_is_one_writer(tmp_path: Path) -> None:
    save = '    if hvd.rank() == 0:\n        torch.save(model.state_dict(), "model.pt")\n'
    assert repo_findings(tmp_path, _files(save=save), "GT007") == []
    assert repo_findings(tmp_path, _files(save=save), "GT017") == []


@pytest.mark.parametrize(
    ("save", "code"),
    [
        ('    torch.save(model.state_dict(), "model.pt")\n', "GT007"),  # every rank
        (
            '    if hvd.local_rank() == 0:\n        torch.save(model.state_dict(), "model.pt")\n',
            "GT017",
        ),
    ],
    ids=["unguarded", "local-rank-0"],
)
def test_a_save_of_several_writers_stays_reported(tmp_path: Path, save: str, code: str) -> None:
    assert [line for _, line in repo_findings(tmp_path, _files(save=save), code)] != []
