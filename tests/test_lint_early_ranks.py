"""``gpu-training lint``: a rank read before the process group exists is the fallback.

``rank = dist.get_rank() if dist.is_initialized() else 0`` in a logger set up before
``init_process_group()`` is 0 on every process, so ``logs/run_rank0.log`` opened with mode
``"w"`` is one file every rank truncates (``GT007``; issue 33, set 17: a DDP and a DeepSpeed
pipeline script). Minimal reproductions written here, with variants; the same logger set up
after the group exists writes one file per rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_LOGGERS = {
    "ddp_file_handler": """\
import logging
import os

import torch.distributed as dist


def make_logger(log_dir="logs"):
    os.makedirs(log_dir, exist_ok=True)
    rank = dist.get_rank() if dist.is_initialized() else 0
    name = os.path.join(log_dir, f"run_rank{rank}.log")
    logging.basicConfig(handlers=[logging.FileHandler(name, mode="w")])
    return logging.getLogger()
""",
    "open_for_writing": """\
import os

from torch.distributed import get_rank, is_initialized


def make_logger(log_dir="logs"):
    worker = get_rank() if is_initialized() else 0
    return open(os.path.join(log_dir, "worker%d.txt" % worker), "w")
""",
}

_MAINS = {
    "init_process_group": (
        "import torch.distributed as dist\n",
        "    dist.init_process_group('nccl')\n",
    ),
    "deepspeed": ("import deepspeed\n", "    deepspeed.init_distributed()\n"),
    "setup_helper": (
        "import torch.distributed as dist\n\n\ndef setup():\n"
        "    dist.init_process_group(backend='nccl')\n",
        "    setup()\n",
    ),
}


def _gt007(tmp_path: Path, logger: str, main: str, first: bool) -> list[int]:
    imports, creation = _MAINS[main]
    body = "    log = make_logger()\n"
    order = body + creation if first else creation + body
    source = f"{_LOGGERS[logger]}\n{imports}\n\ndef main():\n{order}    dist_done = True\n"
    source += "\n\nif __name__ == '__main__':\n    main()\n"
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(source)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return [f.line for f in report.findings if f.code == "GT007"]


@pytest.mark.parametrize("main", sorted(_MAINS))
@pytest.mark.parametrize("logger", sorted(_LOGGERS))
def test_a_rank_stamped_log_opened_before_the_group_is_one_shared_file(
    tmp_path: Path, logger: str, main: str
) -> None:
    assert len(_gt007(tmp_path, logger, main, first=True)) == 1


@pytest.mark.parametrize("main", sorted(_MAINS))
@pytest.mark.parametrize("logger", sorted(_LOGGERS))
def test_the_same_log_opened_after_the_group_is_one_file_per_rank(
    tmp_path: Path, logger: str, main: str
) -> None:
    assert _gt007(tmp_path, logger, main, first=False) == []
