"""``gpu-training lint``: rank-0 predicates with a fallback for the run without a group.

Projects write "am I the main process" as a rank test on the distributed path and a constant
elsewhere (``return get_rank() == 0 if config.ddp else True``). Such a predicate is a rank-0
guard when the test that picks the rank branch is true in every multi-process run: a query of
the group (``dist.is_initialized()``, ``world_size > 1``), a flag named for the group, or a
configuration constant the project never sets otherwise. A user option that may be off while
a launcher starts every process is none of these: the writes under it stay ``GT007``.
Minimal reproductions written here (issue 33, set 13).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_MAIN = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers import is_main_process, save_meta


def main():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(2, 2).cuda())
    if is_main_process():
        torch.save(model.module.state_dict(), "model.pt")
    save_meta({"step": 1}, "meta.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

_SAVE = """

def save_meta(meta, path):
    if is_main_process():
        torch.save(meta, path)
"""

_PREDICATES = {
    # a configuration module's constant picks the rank branch (set 13's shape)
    "config_constant": (
        "import torch\nimport torch.distributed as dist\nimport settings\n\n\n"
        "def _rank():\n    return dist.get_rank() if dist.is_initialized() else 0\n\n\n"
        "def is_main_process():\n    return _rank() == 0 if settings.ddp else True\n",
        "ddp = True\n",
    ),
    # the group itself picks it
    "group_query": (
        "import torch\nimport torch.distributed as dist\n\n\n"
        "def is_main_process():\n"
        "    return dist.get_rank() == 0 if dist.is_initialized() else True\n",
        None,
    ),
    # the single-process side first, chosen by the world size
    "world_size_first": (
        "import os\n\nimport torch\n\n\n"
        "def is_main_process():\n"
        "    world_size = int(os.environ.get('WORLD_SIZE', 1))\n"
        "    return True if world_size == 1 else int(os.environ['RANK']) == 0\n",
        None,
    ),
    # an imported constant, and False (nobody) as the fallback
    "imported_constant_false_fallback": (
        "import torch\nimport torch.distributed as dist\nfrom settings import USE_DDP\n\n\n"
        "def is_main_process():\n    return dist.get_rank() == 0 if USE_DDP else False\n",
        "USE_DDP = True\n",
    ),
}


def _repository(tmp_path: Path, helpers: str, settings: str | None) -> Path:
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(_MAIN)
    (tmp_path / "helpers.py").write_text(helpers + _SAVE)
    if settings is not None:
        (tmp_path / "settings.py").write_text(settings)
    return tmp_path


def _gt007(root: Path) -> set[tuple[str, int]]:
    report = lint_paths([root])
    assert not report.errors, report.errors
    return {(Path(f.path).name, f.line) for f in report.findings if f.code == "GT007"}


@pytest.mark.parametrize("case", sorted(_PREDICATES))
def test_a_rank_test_with_a_no_group_fallback_guards_rank0(tmp_path: Path, case: str) -> None:
    helpers, settings = _PREDICATES[case]
    assert _gt007(_repository(tmp_path, helpers, settings)) == set()


_USER_OPTION = (
    "import argparse\n\nimport torch\nimport torch.distributed as dist\n\n"
    "parser = argparse.ArgumentParser()\n"
    "parser.add_argument('--use_ddp', action='store_true')\n"
    "args = parser.parse_args()\n\n\n"
    "def is_main_process():\n    return dist.get_rank() == 0 if args.use_ddp else True\n"
)


def test_a_user_option_that_may_be_off_is_no_rank0_guard(tmp_path: Path) -> None:
    # without --use_ddp every process torchrun starts takes the `True` side and writes
    assert ("train.py", 15) in _gt007(_repository(tmp_path, _USER_OPTION, None))


def test_a_setting_assigned_both_values_is_no_rank0_guard(tmp_path: Path) -> None:
    helpers, _ = _PREDICATES["config_constant"]
    root = _repository(tmp_path, helpers, "ddp = True\nif DEBUG:\n    ddp = False\n")
    assert ("train.py", 15) in _gt007(root)
