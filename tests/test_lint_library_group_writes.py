"""``gpu-training lint`` ``GT007``: writes every process makes, where the group is a library's.

Issue 33, sets 14 and 15:

* ``deepspeed.initialize`` creates the process group when none exists, so a script that
  calls nothing else (launched by ``deepspeed``) runs in every process: a step log opened
  with ``"w"`` before or after it is truncated and written by every rank;
* ``profiler.export_chrome_trace(path)`` writes a file: unguarded, every rank writes the
  same trace path (DDP, FSDP).

Not reported: the same writes under the engine's global rank 0, or to a path with the rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_DEEPSPEED = """\
import argparse
import csv

import deepspeed


def main(model):
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    {before}
    engine, _, _, _ = deepspeed.initialize(args=args, model=model)
    {after}
    writer = csv.writer(out)
    for step in range(10):
        loss = engine(step)
        engine.backward(loss)
        engine.step()
        if engine.global_rank == 0:
            writer.writerow([step, loss.item()])


if __name__ == "__main__":
    main(None)
"""

_OPEN = 'out = open("results/steps.csv", "w")'

_TRACE = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, loader, trace_path):
    dist.init_process_group("nccl")
    model = DDP(model)
    profiler = torch.profiler.profile()
    profiler.__enter__()
    for batch in loader:
        model(batch).sum().backward()
        profiler.step()
    {guard}profiler.export_chrome_trace(trace_path)


if __name__ == "__main__":
    train(None, [], "trace.json")
"""


def _gt007(root: Path, text: str) -> list[int]:
    (root / ".git").mkdir()
    (root / "train.py").write_text(text)
    return sorted(f.line for f in lint_paths([root]).findings if f.code == "GT007")


@pytest.mark.parametrize(("before", "after", "line"), [(_OPEN, "", 11), ("", _OPEN, 13)])
def test_a_log_every_deepspeed_process_opens(
    tmp_path: Path, before: str, after: str, line: int
) -> None:
    text = _DEEPSPEED.format(before=before or "pass", after=after or "pass")
    assert _gt007(tmp_path, text) == [line]


def test_the_log_opened_on_the_engines_rank_zero(tmp_path: Path) -> None:
    guarded = 'out = open("results/steps.csv", "w") if engine.global_rank == 0 else None'
    text = _DEEPSPEED.format(before="pass", after=guarded)
    assert _gt007(tmp_path, text) == []


def test_a_chrome_trace_every_rank_exports(tmp_path: Path) -> None:
    assert _gt007(tmp_path, _TRACE.format(guard="")) == [14]


def test_a_chrome_trace_on_rank_zero(tmp_path: Path) -> None:
    text = _TRACE.format(guard="if dist.get_rank() == 0:\n        ")
    assert _gt007(tmp_path, text) == []


def test_a_chrome_trace_per_rank(tmp_path: Path) -> None:
    text = _TRACE.replace(
        "export_chrome_trace(trace_path)", 'export_chrome_trace(f"t{dist.get_rank()}.json")'
    )
    assert _gt007(tmp_path, text.replace("{guard}", "")) == []


_COPIES = """\
import os
import shutil

import torch.distributed as dist


def main(cfg_path, out_dir):
    dist.init_process_group("nccl")
    {copy}
    if dist.get_rank() == 0:
        shutil.copy(cfg_path, os.path.join(out_dir, "config_rank0.yaml"))


if __name__ == "__main__":
    main("cfg.yaml", "runs/x")
"""


@pytest.mark.parametrize(
    ("copy", "expected"),
    [
        ('shutil.copyfile(cfg_path, os.path.join(out_dir, "config.yaml"))', [9]),
        ('shutil.copytree("assets", out_dir + "/assets", dirs_exist_ok=True)', [9]),
        ('shutil.copy(cfg_path, f"{out_dir}/cfg_{dist.get_rank()}.yaml")', []),
    ],
)
def test_a_shutil_copy_every_rank_makes(tmp_path: Path, copy: str, expected: list[int]) -> None:
    assert _gt007(tmp_path, _COPIES.format(copy=copy)) == expected
