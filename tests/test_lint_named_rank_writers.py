"""``gpu-training lint`` ``GT007``: a helper called under ``rank == 0`` and under ``rank == 1``.

Issue 33, the fourth random sample of findings (``benchmarks/lint_ddpsample4_triage.csv``): a
model-parallel script saves shards through one helper, ``if epoch == 0 and rank == 0:
save_specific_shards(shards, [1, 2, 3])`` and ``if epoch == 1 and rank == 1:
save_specific_shards(shards, [4])``. Each call runs in one process; the helper's ``torch.save``
was reported as every rank's write, because ``rank == 1`` was read as one process only when it
stood alone. A conjunction with such a test holds on one rank too. A helper also called with no
guard stays reported. Minimal reproductions written here.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import torch.distributed as dist


def save_specific_shards(shards, indices):
    for i in indices:
        torch.save(shards[i], f"model_shard_{i}.pth")


def train(rank, world_size, shards):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    for epoch in range(2):
        if epoch == 0 and rank == 0:
            save_specific_shards(shards, [1, 2, 3])
        if epoch == 1 and rank == 1:
            save_specific_shards(shards, [4])
        EXTRA
    dist.destroy_process_group()


if __name__ == "__main__":
    train(int(__import__("os").environ["RANK"]), 2, {})
"""


def test_a_helper_called_by_named_ranks_only_is_one_writer(tmp_path: Path) -> None:
    files = {"model_parallel.py": _SCRIPT.replace("EXTRA", "pass")}
    assert repo_findings(tmp_path, files, "GT007") == []


def test_a_helper_also_called_on_every_rank_stays_reported(tmp_path: Path) -> None:
    files = {"model_parallel.py": _SCRIPT.replace("EXTRA", "save_specific_shards(shards, [0])")}
    assert len(repo_findings(tmp_path, files, "GT007")) >= 1
