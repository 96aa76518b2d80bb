"""``gpu-training lint`` ``GT005``: an epoch loop that runs once needs no ``set_epoch``.

Issue 33, the random sample of findings over 111 DDP repositories
(``benchmarks/lint_ddpsample_triage.csv``): a course repository's all-reduce demo trains
``for epoch in range(1):`` over a shuffling ``DistributedSampler`` and never calls
``set_epoch``; with one epoch the sampler's order comes from its seed alone and there is no
next epoch to reshuffle (the reader: false). Two epochs, or a count the script is given,
stay reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def main(epochs):
    dist.init_process_group("gloo")
    data = list(range(64))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in EPOCHS:
        for x in loader:
            optimizer.zero_grad()
            model(x.float().view(-1, 1)).sum().backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(3)
"""


@pytest.mark.parametrize(
    ("epochs", "found"),
    [
        ("range(1)", []),
        ("range(0, 1)", []),
        ("range(2)", [("train.py", 12)]),
        ("range(epochs)", [("train.py", 12)]),
    ],
)
def test_one_epoch_or_more(tmp_path: Path, epochs: str, found: list[tuple[str, int]]) -> None:
    script = _SCRIPT.replace("EPOCHS", epochs)
    assert repo_findings(tmp_path, {"train.py": script}, "GT005") == found
