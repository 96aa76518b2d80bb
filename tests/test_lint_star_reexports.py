"""``gpu-training lint``: a package's ``__init__`` that re-exports its modules with
``from .train_utils import *`` hands their functions on, and imports them.

Issue 33, set 18: ``train.py`` builds the Accelerator, prepares the model and calls
``train(...)`` imported from ``pkg.utils``, whose ``__init__`` is ``from .train_utils import
*``; the training loop there backpropagates every micro-batch with ``accelerator.backward``
and steps every ``grad_acc`` batches, with no ``accelerator.accumulate()`` (``GT013``). The
helper is the entry script's, through the star import: its callee resolves and the file
inherits the script's distributed, wrapped model. Minimal reproductions written here, with
variants (DDP; ``from pkg import *``); not reported: a loop under ``accumulate()``.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_TRAIN_UTILS = """\
from accelerate import Accelerator


def train(model, loader, accelerator: Accelerator, optimizer, grad_acc):
    model.train()
    for batch_id, batch in enumerate(loader, start=1):
        loss = model(**batch).loss
        accelerator.backward(loss / grad_acc)
        if batch_id % grad_acc == 0:
            optimizer.step()
            optimizer.zero_grad()
"""

_ACCELERATE_MAIN = """\
import torch
from accelerate import Accelerator

from pkg.utils import build_model, train


def main(cfg):
    accelerator = Accelerator(mixed_precision="bf16")
    model = build_model(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, cfg.loader)
    train(model, loader, accelerator, optimizer, 4)


if __name__ == "__main__":
    main(None)
"""

_MODEL_UTILS = "def build_model(cfg):\n    return cfg.model\n"

_DDP_LOOPS = """\
def run_epoch(ddp_model, loader, opt, accum):
    for step, (x, y) in enumerate(loader):
        loss = ddp_model(x).sub(y).pow(2).mean() / accum
        loss.backward()
        if (step + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
"""

_DDP_MAIN = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from pkg import *


def main(model, loader, local_rank):
    dist.init_process_group("nccl")
    ddp = DDP(model.cuda(), device_ids=[local_rank])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for epoch in range(3):
        run_epoch(ddp, loader, opt, 8)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(None, [], 0)
"""


def _gt013(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT013")


def test_a_training_loop_re_exported_by_a_star_import(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/utils/__init__.py": "from .model_utils import *\nfrom .train_utils import *\n",
        "pkg/utils/model_utils.py": _MODEL_UTILS,
        "pkg/utils/train_utils.py": _TRAIN_UTILS,
        "train.py": _ACCELERATE_MAIN,
    }
    assert _gt013(tmp_path, files) == [("train_utils.py", 8)]


def test_a_loop_under_accumulate_is_not_reported(tmp_path: Path) -> None:
    accumulated = _TRAIN_UTILS.replace(
        "        loss = model(**batch).loss\n        accelerator.backward(loss / grad_acc)\n",
        "        with accelerator.accumulate(model):\n"
        "            loss = model(**batch).loss\n"
        "            accelerator.backward(loss / grad_acc)\n",
    )
    files = {
        "pkg/__init__.py": "",
        "pkg/utils/__init__.py": "from .model_utils import *\nfrom .train_utils import *\n",
        "pkg/utils/model_utils.py": _MODEL_UTILS,
        "pkg/utils/train_utils.py": accumulated,
        "train.py": _ACCELERATE_MAIN,
    }
    assert _gt013(tmp_path, files) == []


def test_a_ddp_loop_re_exported_to_a_star_importing_script(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from .loops import *\n",
        "pkg/loops.py": _DDP_LOOPS,
        "main.py": _DDP_MAIN,
    }
    assert _gt013(tmp_path, files) == [("loops.py", 4)]
