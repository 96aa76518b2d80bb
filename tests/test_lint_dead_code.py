"""``gpu-training lint``: functions, classes and methods that no running code reaches.

Issue 33, set 20: a trainer kept a ``train_epoch`` method its ``train()`` no longer called
(the loop had moved to a module), a ``save_checkpoint`` method beside the helper of the same
name that ``train()`` used, and a ``DistributedTrainer`` class that only a never-called
method built, re-exported by its package ``__init__``. Their writes and accumulation loops
were flagged though no process runs them. Minimal reproductions written here, with the cases
that keep their findings (an alias import, a class with a base, a class handed to a command
line builder, a computed ``getattr``, a name in a config file, a snippet without a script).
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths
from lint_repo import write_repo

_TRAINER = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from loop import save_checkpoint, train_one_epoch


class Trainer:
    def __init__(self, model, loader, accum):
        dist.init_process_group("nccl")
        self.model = DDP(model)
        self.loader = loader
        self.accum = accum
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(self):
        for epoch in range(3):
            train_one_epoch(self.model, self.loader, self.optimizer)
            if dist.get_rank() == 0:
                save_checkpoint(self.model.module.state_dict(), epoch)
        dist.destroy_process_group()

    def train_epoch(self):
        for step, (x, y) in enumerate(self.loader):
            loss = torch.nn.functional.mse_loss(self.model(x), y) / self.accum
            loss.backward()
            if (step + 1) % self.accum == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()

    def save_checkpoint(self, epoch):
        torch.save(self.model.state_dict(), f"epoch{epoch}.pt")


if __name__ == "__main__":
    Trainer(torch.nn.Linear(2, 2), [], 4).train()
"""

_LOOP = """\
import torch


def train_one_epoch(model, loader, optimizer):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def save_checkpoint(state, epoch):
    torch.save(state, f"epoch{epoch}.pt")
"""

# what the two unused methods would do, were they called
_UNUSED = [("trainer.py", 26, "GT013"), ("trainer.py", 32, "GT006"), ("trainer.py", 32, "GT007")]


def _found(root: Path, files: dict[str, str]) -> list[tuple[str, int, str]]:
    report = lint_paths([write_repo(root, files)])
    return sorted((Path(f.path).name, f.line, f.code) for f in report.findings)


def _trainer() -> dict[str, str]:
    return {"trainer.py": _TRAINER, "loop.py": _LOOP}


def test_methods_nothing_calls_are_not_reported(tmp_path: Path) -> None:
    """``train()`` uses the loop module's functions; the methods of the same names are left."""
    assert _found(tmp_path, _trainer()) == []


def test_the_same_methods_called_are_reported(tmp_path: Path) -> None:
    files = _trainer()
    files["trainer.py"] = files["trainer.py"].replace(
        "            train_one_epoch(self.model, self.loader, self.optimizer)\n",
        "            self.train_epoch()\n            self.save_checkpoint(epoch)\n",
    )
    found = _found(tmp_path, files)
    assert {("trainer.py", 27, "GT013"), ("trainer.py", 33, "GT006")} <= set(found)
    assert ("trainer.py", 33, "GT007") in found


def test_a_call_inside_a_method_nothing_calls_reaches_nothing(tmp_path: Path) -> None:
    """``restart`` calls both methods, and nothing calls ``restart``."""
    files = _trainer()
    files["trainer.py"] = files["trainer.py"].replace(
        "    def train_epoch(self):",
        "    def restart(self):\n        self.train_epoch()\n        self.save_checkpoint(0)\n\n"
        "    def train_epoch(self):",
    )
    assert _found(tmp_path, files) == []


def test_methods_of_a_class_with_a_base_count_as_running(tmp_path: Path) -> None:
    """A framework may call them by their own names (``forward``, a Lightning hook)."""
    files = _trainer()
    files["trainer.py"] = files["trainer.py"].replace("class Trainer:", "class Trainer(Base):")
    files["trainer.py"] = files["trainer.py"].replace(
        "from loop import", "from base import Base\nfrom loop import"
    )
    files["base.py"] = "class Base:\n    pass\n"
    found = _found(tmp_path, files)
    assert ("trainer.py", 27, "GT013") in found


def test_a_class_handed_over_as_a_value_keeps_every_method(tmp_path: Path) -> None:
    """``fire.Fire(Trainer)`` may call any method the command line names."""
    files = _trainer()
    files["trainer.py"] = files["trainer.py"].replace(
        "    Trainer(torch.nn.Linear(2, 2), [], 4).train()\n", "    fire.Fire(Trainer)\n"
    )
    files["trainer.py"] = "import fire\n" + files["trainer.py"]
    shifted = [(name, line + 1, code) for name, line, code in _UNUSED]
    assert set(shifted) <= set(_found(tmp_path, files))


def test_a_method_reached_by_a_computed_getattr(tmp_path: Path) -> None:
    files = _trainer()
    files["trainer.py"] = files["trainer.py"].replace(
        "            train_one_epoch(self.model, self.loader, self.optimizer)\n",
        '            getattr(self, "train_" + self.mode)()\n',
    )
    assert ("trainer.py", 26, "GT013") in _found(tmp_path, files)


def test_a_method_a_config_file_names(tmp_path: Path) -> None:
    files = {**_trainer(), "hooks.yaml": "on_epoch_end: save_checkpoint\n"}
    assert ("trainer.py", 32, "GT007") in _found(tmp_path, files)


def test_snippets_without_a_script_keep_their_findings(tmp_path: Path) -> None:
    """No module of the directory runs anything itself: nothing to reach from."""
    files = _trainer()
    files["trainer.py"] = files["trainer.py"].split("\n\nif __name__")[0] + "\n"
    assert set(_UNUSED) <= set(_found(tmp_path, files))


_PACKAGE = {
    "pkg/__init__.py": (
        "from .engine import Engine\nfrom .dist_trainer import DistTrainer\n\n"
        '__all__ = ["Engine", "DistTrainer"]\n'
    ),
    "pkg/dist_trainer.py": (
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n\n"
        "class DistTrainer:\n    def __init__(self, model):\n        self.model = DDP(model)\n\n"
        "    def save(self):\n"
        '        torch.save(self.model.state_dict(), "dist.pt")\n'
    ),
    "pkg/engine.py": (
        "import torch\nimport torch.distributed as dist\nfrom .dist_trainer import DistTrainer\n"
        "\n\nclass Engine:\n    def run(self):\n        dist.init_process_group('nccl')\n"
        "        dist.destroy_process_group()\n\n"
        "    def wrap(self):\n        DistTrainer(torch.nn.Linear(2, 2)).save()\n"
    ),
    "main.py": (
        "from pkg import Engine\n\n\ndef main():\n    Engine().run()\n\n\n"
        'if __name__ == "__main__":\n    main()\n'
    ),
}


def test_a_class_only_an_unused_method_builds_and_its_package_re_exports(tmp_path: Path) -> None:
    assert _found(tmp_path, dict(_PACKAGE)) == []


def test_a_class_imported_under_an_alias_and_built(tmp_path: Path) -> None:
    files = dict(_PACKAGE)
    files["main.py"] = (
        "import torch\nimport torch.distributed as dist\n"
        "from pkg.dist_trainer import DistTrainer as T\n\n\n"
        "def main():\n    dist.init_process_group('nccl')\n"
        "    T(torch.nn.Linear(2, 2)).save()\n    dist.destroy_process_group()\n\n\n"
        'if __name__ == "__main__":\n    main()\n'
    )
    assert ("dist_trainer.py", 10, "GT006") in _found(tmp_path, files)


def test_a_method_only_a_docstring_names_is_not_reached(tmp_path: Path) -> None:
    """Set 17: a backend class's method named only in a package's quick-start docstring (an
    example nobody runs); a string the code uses (a ``getattr``) still reaches it."""
    files = _trainer()
    files["trainer.py"] = (
        '"""Quick start::\n\n    trainer.train_epoch()\n    trainer.save_checkpoint(0)\n"""\n'
        + files["trainer.py"]
    )
    assert _found(tmp_path, files) == []
    files["trainer.py"] = files["trainer.py"].replace(
        "            train_one_epoch(self.model, self.loader, self.optimizer)\n",
        '            getattr(self, "save_checkpoint")(epoch)\n',
    )
    assert ("trainer.py", 37, "GT007") in _found(tmp_path, files)
