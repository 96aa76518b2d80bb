"""``gpu-training lint``: modules the repository never imports nor runs.

A vendored library's trainer nobody imports (issue 33, set 18: DiffSynth's Lightning
trainers inside LoFA, whose own launcher runs ``lofa/trainer``) and an old copy of a helper
(``evaluation.py`` beside the ``evaluator.py`` the scripts import) never execute: their
functions' writes and device choices are no bug of the repository. Minimal reproductions
written here: a flat repository, a package under ``src/``, and the cases that keep
their findings (a star import, a launcher naming the file, stand-alone snippets).
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths

_TRAIN = """\
import torch
import torch.distributed as dist
from {module} import {name}

def main():
    dist.init_process_group("nccl")
    {name}()

if __name__ == "__main__":
    main()
"""

_WRITES = """\
import torch

def {name}():
    torch.save({{"a": 1}}, "memory.pt")
"""

_OLD_COPY = """\
import torch
import torch.distributed as dist


class Evaluation(torch.nn.Module):
    def save_memory(self):
        torch.save(self.state_dict(), "memory.pt")

    def forward(self, x):
        dist.barrier()
        self.save_memory()
        return x
"""


def _gt007(root: Path) -> list[tuple[str, int]]:
    return sorted(
        (Path(f.path).relative_to(root).as_posix(), f.line)
        for f in lint_paths([root]).findings
        if f.code == "GT007"
    )


def _repo(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()
    return tmp_path


def test_an_old_copy_beside_the_imported_helper_is_not_read(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    (root / "evaluator.py").write_text(_WRITES.format(name="evaluate"))
    (root / "evaluation.py").write_text(_OLD_COPY)
    (root / "train.py").write_text(_TRAIN.format(module="evaluator", name="evaluate"))
    assert _gt007(root) == [("evaluator.py", 4), ("train.py", 7)]
    (root / "run_eval.py").write_text(
        "from evaluation import Evaluation\n\nif __name__ == '__main__':\n    Evaluation()(1)\n"
    )
    assert ("evaluation.py", 7) in _gt007(root)  # imported: it runs


_VENDORED_TRAINER = """\
import torch.distributed as dist


def _write_config():
    with open("configuration.json", "w") as f:
        f.write("{}")


def fit():
    dist.barrier()
    _write_config()
"""


def test_a_vendored_trainer_in_a_src_layout_is_not_read(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    package = root / "src" / "vendored"
    (package / "trainers").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text("X = 1\n")
    (package / "trainers" / "__init__.py").write_text("")
    (package / "trainers" / "lightning_trainer.py").write_text(_VENDORED_TRAINER)
    (root / "launch.py").write_text(
        "from vendored.models import X\n\nif __name__ == '__main__':\n    print(X)\n"
    )
    assert _gt007(root) == []
    (root / "fit.py").write_text(  # now something runs it
        "from vendored.trainers.lightning_trainer import fit\n\n"
        "if __name__ == '__main__':\n    fit()\n"
    )
    assert _gt007(root) == [("src/vendored/trainers/lightning_trainer.py", 5)]


def test_a_module_imported_with_a_star_is_read(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    (root / "methods").mkdir()
    (root / "methods" / "__init__.py").write_text("from .vanilla import *\n")
    (root / "methods" / "vanilla.py").write_text(_OLD_COPY)
    (root / "methods" / "other.py").write_text("X = 1\n")
    (root / "main.py").write_text(_TRAIN.format(module="methods", name="Evaluation"))
    (root / "util.py").write_text("from methods.other import X\n")
    assert ("methods/vanilla.py", 7) in _gt007(root)


def test_a_module_a_launcher_or_a_string_names_is_read(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    (root / "evaluator.py").write_text(_WRITES.format(name="evaluate"))
    (root / "evaluation.py").write_text(_OLD_COPY)
    (root / "plugin.py").write_text(_OLD_COPY)
    (root / "train.py").write_text(
        _TRAIN.format(module="evaluator", name="evaluate")
        + "\nimport importlib\nimportlib.import_module('plugin')\n"
    )
    (root / "eval.sh").write_text("torchrun --nproc_per_node 2 -c 'import evaluation.py'\n")
    found = _gt007(root)
    assert ("evaluation.py", 7) in found
    assert ("plugin.py", 7) in found


def test_stand_alone_snippets_keep_their_findings(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    (root / "a.py").write_text(
        "import torch.distributed as dist\nimport torch\n\n"
        "def save(state):\n    dist.barrier()\n    torch.save(state, 'ckpt.pt')\n"
    )
    (root / "b.py").write_text(_TRAIN.format(module="torch", name="manual_seed"))
    assert ("a.py", 6) in _gt007(root)


def test_a_module_whose_top_level_calls_its_functions_is_a_script(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    (root / "evaluator.py").write_text(_WRITES.format(name="evaluate"))
    (root / "evaluation.py").write_text(_OLD_COPY + "\nEvaluation()(1)\n")
    (root / "train.py").write_text(_TRAIN.format(module="evaluator", name="evaluate"))
    assert ("evaluation.py", 7) in _gt007(root)


def _sub_packages(root: Path) -> None:
    """A package ``src/`` whose scripts use ``src.pretrain``; ``src.sft`` re-exports its
    trainer from its own ``__init__.py`` and nothing else imports it."""
    (root / ".git").mkdir()
    files = {
        "src/__init__.py": "from .pretrain import PretrainTrainer\n",
        "src/pretrain/__init__.py": "from .trainer import PretrainTrainer\n",
        "src/pretrain/trainer.py": (
            "import torch\n\n\nclass PretrainTrainer:\n    def fit(self):\n"
            '        torch.save({"a": 1}, "pretrain.pt")\n'
        ),
        "src/sft/__init__.py": "from .trainer import SFTTrainer\n",
        "src/sft/trainer.py": (
            "import torch\nimport torch.distributed as dist\n\n\nclass SFTTrainer:\n"
            '    def fit(self):\n        dist.barrier()\n        torch.save({"a": 1}, "sft.pt")\n'
        ),
        "scripts/pretrain.py": (
            "import torch.distributed as dist\nfrom src.pretrain import PretrainTrainer\n\n"
            'if __name__ == "__main__":\n    dist.init_process_group("nccl")\n'
            "    PretrainTrainer().fit()\n"
        ),
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_sub_package_only_its_own_init_imports_is_not_read(tmp_path: Path) -> None:
    _sub_packages(tmp_path)
    assert _gt007(tmp_path) == [("scripts/pretrain.py", 6), ("src/pretrain/trainer.py", 6)]


def test_a_table_of_configs_at_a_modules_top_level_runs_nothing(tmp_path: Path) -> None:
    """Set 20: the evaluation harness keeps ``LEADERBOARD_CONFIGS = {"...": EvalConfig(...)}``
    at its top level, a dataclass's values; the module is no script, the package an orphan."""
    _sub_packages(tmp_path)
    trainer = tmp_path / "src" / "sft" / "trainer.py"
    trainer.write_text(
        "from dataclasses import dataclass\n\n\n@dataclass\nclass SFTConfig:\n    lr: float\n\n\n"
        + trainer.read_text()
        + '\n\nCONFIGS = {"small": SFTConfig(lr=1e-4)}\nDEFAULT = SFTConfig(lr=1e-3)\n'
    )
    assert _gt007(tmp_path) == [("scripts/pretrain.py", 6), ("src/pretrain/trainer.py", 6)]


def test_a_top_level_object_of_its_own_class_makes_a_script(tmp_path: Path) -> None:
    _sub_packages(tmp_path)
    trainer = tmp_path / "src" / "sft" / "trainer.py"
    trainer.write_text(trainer.read_text() + "\n\nresult = SFTTrainer().fit()\n")
    assert ("src/sft/trainer.py", 8) in _gt007(tmp_path)


def test_a_sub_package_a_script_imports_is_read(tmp_path: Path) -> None:
    _sub_packages(tmp_path)
    (tmp_path / "scripts" / "sft.py").write_text(
        "import torch.distributed as dist\nimport src.sft as sft\n\n"
        'if __name__ == "__main__":\n    dist.init_process_group("nccl")\n'
        "    sft.SFTTrainer().fit()\n"
    )
    assert ("src/sft/trainer.py", 8) in _gt007(tmp_path)


def test_a_sub_package_a_launcher_runs_is_read(tmp_path: Path) -> None:
    _sub_packages(tmp_path)
    (tmp_path / "src" / "sft" / "__main__.py").write_text(
        "from .trainer import SFTTrainer\n\nSFTTrainer().fit()\n"
    )
    (tmp_path / "run_sft.sh").write_text("torchrun --nproc_per_node 8 -m src.sft\n")
    assert ("src/sft/trainer.py", 8) in _gt007(tmp_path)


def test_a_sub_package_with_a_script_of_its_own_is_read(tmp_path: Path) -> None:
    _sub_packages(tmp_path)
    (tmp_path / "src" / "sft" / "train.py").write_text(
        "import torch.distributed as dist\nfrom src.sft.trainer import SFTTrainer\n\n"
        'if __name__ == "__main__":\n    dist.init_process_group("nccl")\n'
        "    SFTTrainer().fit()\n"
    )
    assert ("src/sft/trainer.py", 8) in _gt007(tmp_path)
