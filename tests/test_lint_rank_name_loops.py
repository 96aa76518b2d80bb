"""``gpu-training lint``: a rank read from whichever launcher variable is set.

A script meant for ``torchrun``, ``deepspeed`` and SLURM reads its rank as ``for k in
("RANK", "LOCAL_RANK", "SLURM_PROCID"): v = os.environ.get(k) ...; return int(v)`` with
``return -1`` when none is set, and guards its one-time dataset build with ``r in (-1,
0)``. That helper returns a rank (``-1`` is a literal, as ``0`` is), the first variable the
launchers set is the global ``RANK``, so the guard is global rank 0: one writer, no
``GT007`` and no ``GT017``. Minimal reproductions written here (issue 33, set 25: a
vision-language model's data cache, under the deepspeed launcher). A loop over names that
are not all rank variables reads no rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_SCRIPT = """\
import os

import torch.distributed as dist


def _rk_env() -> int:
    for k in ({names}):
        v = os.environ.get(k)
        if v is None:
            continue
        try:
            return int(v)
        except Exception:
            pass
    return -1


def _is_rank0_env() -> bool:
    r = _rk_env()
    return r in (-1, 0)


def build_cache(path):
    if _is_rank0_env():
        with open(path, "w") as f:
            f.write("done")


dist.init_process_group("nccl")
build_cache("cache/_DONE")
dist.barrier()
dist.destroy_process_group()
"""


def _codes(tmp_path: Path, names: str) -> list[str]:
    (tmp_path / "train.py").write_text(_SCRIPT.replace("{names}", names))
    report = lint_paths([tmp_path / "train.py"])
    assert not report.errors, report.errors
    return sorted(f.code for f in report.findings)


def test_a_rank_from_the_first_launcher_variable_set_guards_one_writer(tmp_path: Path) -> None:
    assert _codes(tmp_path, '"RANK", "LOCAL_RANK", "SLURM_PROCID"') == []


def test_the_local_rank_first_is_one_writer_per_node(tmp_path: Path) -> None:
    assert _codes(tmp_path, '"LOCAL_RANK", "RANK"') == ["GT017"]


@pytest.mark.parametrize("names", ['"RANK", "OUTPUT_DIR"', '"WORLD_SIZE",'])
def test_other_names_read_no_rank(tmp_path: Path, names: str) -> None:
    assert _codes(tmp_path, names) == ["GT007"]
