"""``gpu-training lint``: an Accelerator (or Fabric) built by a helper of the project (``GT013``).

``accelerator = init_accelerator(args)`` with ``def init_accelerator(args): return
Accelerator(...)`` in another module is the same Accelerator the file would build itself: its
``prepare`` wraps the model in DDP, and a hand-written accumulation loop whose
``accelerator.backward`` runs outside ``accelerator.accumulate()`` all-reduces on every
micro-batch. Minimal reproduction written here (issue 33, set 11: a GLUE script whose
Accelerator comes from ``utils.init_accelerator``), with variants: the helper binds the object
before returning it, a Fabric helper, and the ``accumulate()`` loop that stays quiet.
"""

from __future__ import annotations

from pathlib import Path

from gpu_training.diagnostics.lint.report import lint_paths

_HELPER = """\
from datetime import timedelta
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs


def init_accelerator(args):
    kwargs = InitProcessGroupKwargs(timeout=timedelta(seconds=600))
    return Accelerator(gradient_accumulation_steps=args.accum, kwargs_handlers=[kwargs])
"""

_BOUND = """\
from accelerate import Accelerator


def make_runtime(cfg):
    runtime = Accelerator(mixed_precision=cfg.precision)
    return runtime
"""

_FABRIC = """\
from lightning.fabric import Fabric


def build_fabric(cfg):
    fabric = Fabric(accelerator="cuda", devices=cfg.devices, strategy="ddp")
    fabric.launch()
    return fabric
"""

_TRAIN = """\
import torch
from {module} import {helper}


def main(args, model, loader):
    acc = {helper}(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, loader = acc.{prepare}
    for epoch in range(args.epochs):
        for step, batch in enumerate(loader):
            loss = model(**batch).loss / args.accum
            acc.backward(loss)
            if (step + 1) % args.accum == 0:
                optimizer.step()
                optimizer.zero_grad()
"""

_PREPARE = "prepare(model, optimizer, loader)"


def _gt013(tmp_path: Path, helper_text: str, module: str, helper: str, prepare: str) -> list[int]:
    (tmp_path / ".git").mkdir()
    (tmp_path / f"{module}.py").write_text(helper_text)
    train = _TRAIN.format(module=module, helper=helper, prepare=prepare)
    (tmp_path / "train.py").write_text(train)
    findings = lint_paths([tmp_path]).findings
    return sorted(f.line for f in findings if f.code == "GT013" and f.path.endswith("train.py"))


def test_an_accelerator_made_by_a_helper_module(tmp_path: Path) -> None:
    assert _gt013(tmp_path, _HELPER, "utils", "init_accelerator", _PREPARE) == [12]


def test_a_helper_that_binds_the_accelerator_first(tmp_path: Path) -> None:
    assert _gt013(tmp_path, _BOUND, "runtime", "make_runtime", _PREPARE) == [12]


def test_a_fabric_made_by_a_helper(tmp_path: Path) -> None:
    prepare = "setup(model, optimizer)[0], optimizer, acc.setup_dataloaders(loader)"
    assert _gt013(tmp_path, _FABRIC, "fabric_utils", "build_fabric", prepare) == [12]


def test_the_accumulate_context_keeps_it_quiet(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "utils.py").write_text(_HELPER)
    train = _TRAIN.format(module="utils", helper="init_accelerator", prepare=_PREPARE)
    train = train.replace(
        "            loss = model(**batch).loss / args.accum\n            acc.backward(loss)\n",
        "            with acc.accumulate(model):\n"
        "                loss = model(**batch).loss\n                acc.backward(loss)\n",
    )
    (tmp_path / "train.py").write_text(train)
    assert [f for f in lint_paths([tmp_path]).findings if f.code == "GT013"] == []


def test_an_accelerator_handed_straight_to_the_loop(tmp_path: Path) -> None:
    """``main(init_accelerator(args), ...)``: never bound in the calling scope, still the
    file's framework (only calls whose result is kept or handed on are asked what they
    return, since asking every call was most of a large repository's lint time)."""
    train = _TRAIN.replace(
        "def main(args, model, loader):\n    acc = {helper}(args)\n",
        "def main(acc, args, model, loader):\n",
    )
    train += "\n\ndef run(args, model, loader):\n    main({helper}(args), args, model, loader)\n"
    (tmp_path / ".git").mkdir()
    (tmp_path / "utils.py").write_text(_HELPER)
    (tmp_path / "train.py").write_text(
        train.format(module="utils", helper="init_accelerator", prepare=_PREPARE)
    )
    findings = lint_paths([tmp_path]).findings
    assert [f.line for f in findings if f.code == "GT013" and f.path.endswith("train.py")] == [11]
