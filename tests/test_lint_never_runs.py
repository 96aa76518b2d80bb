"""``gpu-training lint``: code that never runs, and files that no two ranks share.

Two things a rank-unaware write check must know (issue 33, set 12):

* a module whose top-level import names a module its own regular package does not hold
  (``from pkg.datasets import build`` with no ``pkg/datasets``) raises ``ImportError`` when it is
  imported or run, and so does a module importing it at its top: nothing after that line runs,
  so it reports nothing there (a vendored tester whose datasets the repository does not ship);
* a path built, through any number of names and calls, from the process's own
  ``TemporaryDirectory()``/``mkdtemp()`` is private to the process: no ``GT007``.

Each repository is a minimal reproduction written here, with variants (DDP, Accelerate, FSDP),
and the same code where the import resolves, or the path is shared, still reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_TESTER = """\
import os

import numpy as np
import torch
import torch.distributed as dist

from {package}.datasets import build_dataset


class Tester:
    def __init__(self, model, cfg):
        self.model = model
        self.cfg = cfg

    def test(self):
        for name, batch in build_dataset(self.cfg):
            pred = self.model(batch).argmax(1).cpu().numpy()
            np.save(os.path.join(self.cfg.save_path, name + "_pred.npy"), pred)
        with open(os.path.join(self.cfg.save_path, "summary.txt"), "w") as handle:
            handle.write("done")
"""

_TRAIN = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(cfg):
    dist.init_process_group("nccl")
    model = DDP(build().cuda())
    {call}
    dist.destroy_process_group()


if __name__ == "__main__":
    main(parse_args())
"""


def _repository(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / ".git").mkdir()
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def _codes(root: Path, name: str) -> set[tuple[int, str]]:
    report = lint_paths([root])
    assert not report.errors, report.errors
    return {(f.line, f.code) for f in report.findings if f.path.endswith(name)}


@pytest.mark.parametrize(
    "layout",
    [
        # the vendored tester: model/pointcept/ is a package without a datasets module
        {"model/__init__.py": "", "model/pointcept/__init__.py": "", "tester": "model.pointcept"},
        # a relative import to a sibling that is not there
        {"engines/__init__.py": "", "tester": "."},
    ],
)
def test_a_module_whose_import_fails_reports_nothing_below_it(
    tmp_path: Path, layout: dict[str, str]
) -> None:
    package = layout.pop("tester")
    folder = package.replace(".", "/") if package != "." else "engines"
    module = f"{folder.replace('/', '.')}.tester"
    call = f"from {module} import Tester\n    Tester(model, cfg).test()"
    files = {**layout, "train.py": _TRAIN.format(call=call)}
    files[f"{folder}/tester.py"] = _TESTER.format(package=package).replace("from ..", "from .")
    root = _repository(tmp_path, files)
    assert _codes(root, "tester.py") == set()


def test_the_same_tester_reports_when_its_datasets_module_is_there(tmp_path: Path) -> None:
    files = {
        "model/__init__.py": "",
        "model/pointcept/__init__.py": "",
        "model/pointcept/datasets.py": "def build_dataset(cfg):\n    return []\n",
        "model/pointcept/tester.py": _TESTER.format(package="model.pointcept"),
        "train.py": _TRAIN.format(
            call="from model.pointcept.tester import Tester\n    Tester(model, cfg).test()"
        ),
    }
    root = _repository(tmp_path, files)
    assert {code for _, code in _codes(root, "tester.py")} == {"GT007"}


def test_a_module_importing_an_unimportable_one_at_its_top_is_dead_too(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/tester.py": _TESTER.format(package="pkg"),
        "pkg/hooks.py": "import os\n\nfrom pkg.tester import Tester\n\n\n"
        "def after_train(trainer):\n"
        "    with open(os.path.join(trainer.out, 'metrics.json'), 'w') as f:\n"
        "        f.write('{}')\n",
        "train.py": _TRAIN.format(call="from pkg.hooks import after_train\n    after_train(cfg)"),
    }
    root = _repository(tmp_path, files)
    assert _codes(root, "hooks.py") == set()


def test_an_installed_top_level_package_is_not_judged(tmp_path: Path) -> None:
    """``from datasets import load_dataset`` names Hugging Face's package, not a missing one."""
    script = _TESTER.replace(
        "from {package}.datasets import build_dataset",
        "from datasets import load_dataset as build_dataset",
    )
    call = "from tester import Tester\n    Tester(model, cfg).test()"
    root = _repository(tmp_path, {"tester.py": script, "train.py": _TRAIN.format(call=call)})
    assert {code for _, code in _codes(root, "tester.py")} == {"GT007"}


def _name_layout(init: str) -> dict[str, str]:
    """``pkg/datasets/__init__.py`` is ``init``; the tester imports ``build_dataset`` from it."""
    return {
        "pkg/__init__.py": "",
        "pkg/datasets/__init__.py": init,
        "pkg/datasets/coco.py": "def load():\n    return []\n",
        "pkg/tester.py": _TESTER.format(package="pkg"),
        "train.py": _TRAIN.format(
            call="from pkg.tester import Tester\n    Tester(model, cfg).test()"
        ),
    }


def test_a_name_its_package_does_not_bind_fails_the_import(tmp_path: Path) -> None:
    """Set 20: ``from src.data import RLDataset`` where ``src/data/__init__.py`` exports other
    names only: the trainer module raises ``ImportError`` and none of its code runs."""
    root = _repository(tmp_path, _name_layout("from .coco import load\n"))
    assert _codes(root, "tester.py") == set()
    # the script's call into it never runs either: its import of the tester raises first
    assert (10, "GT007") not in _codes(root, "train.py")


@pytest.mark.parametrize(
    "init",
    [
        "from .coco import load as build_dataset\n",
        "try:\n    from .coco import load\nexcept ImportError:\n    load = None\n"
        "build_dataset = load\n",
        "def build_dataset(cfg):\n    return []\n",
        "from .coco import *\n",  # may bind it: not judged
        "def __getattr__(name):\n    return None\n",
        "globals()['build_dataset'] = print\n",
    ],
)
def test_a_name_its_package_binds_or_may_bind_imports(tmp_path: Path, init: str) -> None:
    root = _repository(tmp_path, _name_layout(init))
    assert {code for _, code in _codes(root, "tester.py")} == {"GT007"}


def test_a_script_run_at_its_top_level_is_still_judged(tmp_path: Path) -> None:
    """Set 6: a fine-tuning script with no ``__main__`` block, its code at the top level,
    imports a class its model module no longer defines; whoever runs it fixes the import
    first, and then its writes run on every rank."""
    files = _name_layout("from .coco import load\n")
    script = _TESTER.format(package="pkg") + (
        "\n\ndist.init_process_group('nccl')\nTester(torch.nn.Linear(2, 2), None).test()\n"
    )
    files = {**files, "finetune.py": script}
    root = _repository(tmp_path, files)
    assert {code for _, code in _codes(root, "finetune.py")} >= {"GT007"}


def test_a_submodule_of_that_name_imports(tmp_path: Path) -> None:
    files = _name_layout("")
    files["pkg/datasets/build_dataset.py"] = "def __call__():\n    return []\n"
    root = _repository(tmp_path, files)
    assert {code for _, code in _codes(root, "tester.py")} == {"GT007"}


_TEMP_HELPER = """\
import json
import tempfile
from pathlib import Path

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
{imports}

class Restorer:
    @staticmethod
    def _write_assets(root_dir, files):
        for rel_path, content in files.items():
            target = Path(root_dir) / rel_path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)

    def _fix_config(self, folder):
        path = Path(folder) / "tokenizer_config.json"
        data = json.loads(path.read_text())
        data.pop("extra", None)
        path.write_text(json.dumps(data))

    def restore(self, files):
        with {temp} as tmp:
            self._write_assets(tmp, files)
            self._fix_config(tmp)
            return load_from(tmp)


def main(files):
    {setup}
    model = Restorer().restore(files)
    return model


if __name__ == "__main__":
    main({{}})
"""

_TEMP_VARIANTS = {
    "ddp": (
        "",
        "tempfile.TemporaryDirectory(prefix='restore_')",
        "dist.init_process_group('nccl')",
    ),
    "accelerate": (
        "from accelerate import Accelerator",
        "tempfile.TemporaryDirectory()",
        "accelerator = Accelerator()",
    ),
    "fsdp_shm_dir": (
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP",
        'tempfile.TemporaryDirectory(dir="/dev/shm")',
        "dist.init_process_group('nccl'); FSDP(build())",
    ),
}


@pytest.mark.parametrize("variant", sorted(_TEMP_VARIANTS))
def test_writes_under_a_temporary_directory_passed_down_are_private(
    tmp_path: Path, variant: str
) -> None:
    imports, temp, setup = _TEMP_VARIANTS[variant]
    script = _TEMP_HELPER.format(imports=imports, temp=temp, setup=setup)
    root = _repository(tmp_path, {"restore.py": script})
    assert "GT007" not in {code for _, code in _codes(root, "restore.py")}


def test_the_same_helper_writing_to_a_shared_folder_reports(tmp_path: Path) -> None:
    script = _TEMP_HELPER.format(
        imports="", temp="ShareDir('/shared/out')", setup="dist.init_process_group('nccl')"
    )
    root = _repository(tmp_path, {"restore.py": script})
    assert "GT007" in {code for _, code in _codes(root, "restore.py")}


def test_an_entry_script_with_a_broken_import_is_still_judged(tmp_path: Path) -> None:
    """A script run by hand (``__main__``) whose import names a missing module of its package:
    its author runs the training code below once the import is fixed, so it still reports."""
    script = (
        _TESTER.format(package="pkg")
        + "\n\nif __name__ == '__main__':\n    dist.init_process_group('nccl')\n    Tester(1, 2).test()\n"
    )
    files = {
        "pkg/__init__.py": "",
        "pkg/evaluate.py": script,
        "train.py": _TRAIN.format(call="pass"),
    }
    root = _repository(tmp_path, files)
    assert "GT007" in {code for _, code in _codes(root, "evaluate.py")}
