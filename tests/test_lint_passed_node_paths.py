"""``gpu-training lint`` GT017: a node-local write whose path every caller puts on the node's disk.

A vendored data utility (issue 33, set 19) caches its data set under ``if local_rank <= 0:``
to ``f"{output_path}/traindata.pt"``; its one caller passes ``args.data_output_path``, an
option whose default is ``/tmp/data_files/``: one writer per node on each node's own disk is
the intent, not a race. The variants pass the node's scratch directory from the environment,
call a method of a cache class, and use ``dest=``; a shared default, or one caller passing a
shared path, still reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_UTILITY = """\
import os

import torch
import torch.distributed as dist


def create_dataset(local_rank, data_path, output_path):
    os.makedirs(output_path, exist_ok=True)
    train_fname = f"{output_path}/traindata.pt"
    if local_rank <= 0:
        torch.save(load(data_path), train_fname)
    dist.barrier()
    return torch.load(train_fname)
"""

_SCRIPT = """\
import argparse

import deepspeed

from utils.data import create_dataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_path", default="data/train.json")
    parser.add_argument({option}, type=str, default={default}{dest})
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    deepspeed.init_distributed()
    train = create_dataset(args.local_rank, args.data_path, {passed})
    engine, _, _, _ = deepspeed.initialize(model=build(), training_data=train)


if __name__ == "__main__":
    main()
"""


def _gt017(tmp_path: Path, script: str, utility: str = _UTILITY) -> list[int]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("")
    (tmp_path / "utils" / "data.py").write_text(utility)
    (tmp_path / "train.py").write_text(script)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return [f.line for f in report.findings if f.code == "GT017" and f.path.endswith("data.py")]


def _script(default: str, option: str = '"--data_output_path"', dest: str = "") -> str:
    passed = "args.data_output_path" if not dest else "args.cache_dir"
    return _SCRIPT.format(option=option, default=default, dest=dest, passed=passed)


@pytest.mark.parametrize(
    ("default", "option", "dest"),
    [
        ('"/tmp/data_files/"', '"--data_output_path"', ""),  # the instance
        ('"/dev/shm/cache"', '"--data-output-path"', ""),  # a dashed flag, stored with _
        ('"/tmp/cache"', '"-o"', ', dest="cache_dir"'),  # a short flag with dest=
    ],
)
def test_a_cache_on_the_node_s_own_disk_by_the_caller_s_default(
    tmp_path: Path, default: str, option: str, dest: str
) -> None:
    assert _gt017(tmp_path, _script(default, option, dest)) == []


def test_the_same_cache_on_a_shared_default_reports(tmp_path: Path) -> None:
    assert _gt017(tmp_path, _script('"./cache"')) == [11]


def test_a_caller_passing_the_node_scratch_from_the_environment(tmp_path: Path) -> None:
    script = (
        _script('"./cache"')
        .replace("args.data_output_path)", 'os.environ["SLURM_TMPDIR"])')
        .replace("import argparse", "import argparse\nimport os")
    )
    assert _gt017(tmp_path, script) == []


def test_one_caller_passing_a_shared_path_keeps_the_finding(tmp_path: Path) -> None:
    script = _script('"/tmp/data_files/"').replace(
        "    engine, _",
        '    create_dataset(args.local_rank, args.data_path, "/shared/cache")\n    engine, _',
    )
    assert _gt017(tmp_path, script) == [11]


def test_a_method_of_a_cache_class_called_with_the_local_default(tmp_path: Path) -> None:
    utility = """\
import torch
import torch.distributed as dist


class Cache:
    def __init__(self, local_rank):
        self.local_rank = local_rank

    def write(self, dataset, root):
        if self.local_rank == 0:
            torch.save(dataset, f"{root}/cache.pt")
        dist.barrier()


def create_dataset(local_rank, data_path, output_path):
    dataset = load(data_path)
    Cache(local_rank).write(dataset, output_path)
    return dataset
"""
    assert _gt017(tmp_path, _script('"/tmp/ds_cache"'), utility) == []
    shared = tmp_path / "shared"
    shared.mkdir()
    assert _gt017(shared, _script('"outputs/cache"'), utility) == [11]
