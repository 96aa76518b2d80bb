"""``gpu-training lint``: whether the launcher set a variable is the same on every rank.

``if "RANK" in os.environ and "WORLD_SIZE" in os.environ:`` asks whether a launcher started the
script; ``torchrun`` sets both for every process, so every rank takes the branch and a barrier
in it is reached by all: not ``GT009``. ``"RANK" not in os.environ`` is the single-process test,
so ``... or int(os.environ["RANK"]) == 0`` is a rank-0 guard. Issue 33, set 14 (a barrier right
after ``init_process_group`` under the presence test). Minimal reproductions written here, with
variants (Slurm, DeepSpeed, ``os.environ.keys()``); a test of the rank's *value* stays ``GT009``.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths

_TORCHRUN_SETUP = """\
import os
import torch
import torch.distributed as dist


def setup():
    if 'RANK' in os.environ and 'WORLD_SIZE' in os.environ:
        rank = int(os.environ['RANK'])
        gpu = int(os.environ['LOCAL_RANK'])
        torch.cuda.set_device(gpu)
        dist.init_process_group('nccl', rank=rank, world_size=int(os.environ['WORLD_SIZE']))
        dist.barrier()
    else:
        gpu = 0
    return gpu


if __name__ == "__main__":
    setup()
    dist.destroy_process_group()
"""

_SLURM = """\
import os
import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("SLURM_LOCALID", 0)))
    t = torch.ones(1).cuda()
    if "SLURM_PROCID" in os.environ.keys():
        dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

_SINGLE_OR_RANK0 = """\
import json
import os
import deepspeed
import torch.distributed as dist


def main(model, config):
    deepspeed.init_distributed()
    engine, _, _, _ = deepspeed.initialize(model=model, config=config)
    if "LOCAL_RANK" not in os.environ or int(os.environ["RANK"]) == 0:
        with open("metrics.json", "w") as f:
            json.dump({"done": True}, f)
    if int(os.environ["RANK"]) == 0:
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None, None)
"""


def _codes(tmp_path: Path, source: str) -> list[tuple[int, str]]:
    path = tmp_path / "train.py"
    path.write_text(source)
    found = lint_paths([path]).findings
    return sorted((f.line, f.code) for f in found if f.code in {"GT007", "GT009"})


def test_barrier_under_the_launcher_presence_test(tmp_path: Path) -> None:
    """The set-14 case: every torchrun process has RANK and WORLD_SIZE."""
    assert _codes(tmp_path, _TORCHRUN_SETUP) == []


def test_collective_under_a_slurm_presence_test(tmp_path: Path) -> None:
    assert _codes(tmp_path, _SLURM) == []


def test_not_launched_or_rank0_is_a_rank0_guard(tmp_path: Path) -> None:
    """The write is guarded; the barrier under the rank's value is still one-sided."""
    assert _codes(tmp_path, _SINGLE_OR_RANK0) == [(14, "GT009")]
