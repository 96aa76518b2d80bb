"""``gpu-training lint``: a launcher whose trainer class builds the Accelerator.

``accelerate launch launch.py`` starts every process at the top of the launcher; the
``Accelerator()`` (which joins the process group) is only built later, inside the trainer
class the launcher picks (``trainer_cls = ReconTrainer`` ... ``trainer_cls(**cfg)``). The
launcher's own writes before that still run in every process (issue 33, set 18: LoFA's
``OmegaConf.save`` of the run config). Minimal reproductions written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_TRAINER = """\
from accelerate import {maker}


class {name}:
    def __init__(self, out_dir):
        self.state = {maker}()
        self.out_dir = out_dir

    def run(self):
        if self.state.is_main_process:
            print("done")
"""

_LAUNCHERS = {
    "class bound to a name": """\
import os
from omegaconf import OmegaConf
from pkg.trainer import ReconTrainer, DiffTrainer


def main(mode, cfg):
    trainer_cls = ReconTrainer if mode == "recon" else DiffTrainer
    if mode == "diff":
        trainer_cls = DiffTrainer
    os.makedirs(cfg.out_dir, exist_ok=True)
    OmegaConf.save(cfg, os.path.join(cfg.out_dir, "config.yaml"))
    trainer = trainer_cls(**cfg)
    trainer.run()


if __name__ == "__main__":
    main("recon", OmegaConf.load("c.yaml"))
""",
    "class called directly": """\
import json
from pkg.trainer import ReconTrainer


def main(cfg):
    with open("run/config.json", "w") as f:
        json.dump(cfg, f)
    ReconTrainer(**cfg).run()


if __name__ == "__main__":
    main({})
""",
}


@pytest.mark.parametrize("maker", ["Accelerator", "PartialState"])
@pytest.mark.parametrize("launcher", sorted(_LAUNCHERS))
def test_a_write_before_the_trainer_builds_its_accelerator(
    tmp_path: Path, launcher: str, maker: str
) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "trainer.py").write_text(
        _TRAINER.format(maker=maker, name="ReconTrainer")
        + "\n\n"
        + _TRAINER.format(maker=maker, name="DiffTrainer").split("\n\n\n", 1)[1]
    )
    (tmp_path / "launch.py").write_text(_LAUNCHERS[launcher])
    found = [
        (Path(f.path).name, f.code) for f in lint_paths([tmp_path]).findings if f.code != "GT008"
    ]
    assert found == [("launch.py", "GT007")]


def test_a_launcher_whose_trainer_has_no_accelerator_is_one_process(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "trainer.py").write_text(
        "class ReconTrainer:\n    def __init__(self, **cfg):\n        self.cfg = cfg\n\n"
        "    def run(self):\n        pass\n"
    )
    (tmp_path / "launch.py").write_text(_LAUNCHERS["class called directly"])
    assert [f for f in lint_paths([tmp_path]).findings if f.code == "GT007"] == []
