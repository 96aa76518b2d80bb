"""``gpu-training lint`` ``GT006``: a name unwrapped on one branch of an ``if`` and the plain
model on the other is never the DDP wrapper.

Issue 33, held-back set 23 (a public research repository): ``if distributed: model =
DDP(model); base_model = model.module`` / ``else: base_model = model``, then
``maybe_save_checkpoint(cfg, base_model, ...)`` saves ``base_model.state_dict()``. The ``else``
runs only when the model was not wrapped, so no key gets a ``module.`` prefix; the lint read
every binding of ``model`` and reported the save. Minimal reproductions written here, with the
variants that stay reported.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_SCRIPT = """\
import torch
import torch.distributed as dist


def maybe_save(model, path):
    torch.save(model.state_dict(), path)


def main(distributed):
    model = torch.nn.Linear(2, 2)
    if distributed:
        dist.init_process_group("nccl")
        model = torch.nn.parallel.DistributedDataParallel(model)
        base_model = model.module
    else:
        base_model = model
    if not distributed or dist.get_rank() == 0:
        maybe_save(base_model, "a.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(True)
"""


def test_the_plain_model_of_the_other_branch(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _SCRIPT}, "GT006") == []


def test_the_wrapper_itself_on_the_wrapped_branch(tmp_path: Path) -> None:
    text = _SCRIPT.replace("        base_model = model.module\n", "        base_model = model\n")
    assert repo_findings(tmp_path, {"train.py": text}, "GT006") == [("train.py", 18)]


def test_a_wrapping_outside_the_if(tmp_path: Path) -> None:
    text = _SCRIPT.replace(
        "    if not distributed or",
        "    model = torch.nn.parallel.DistributedDataParallel(model)\n    base_model = model\n"
        "    if not distributed or",
    )
    assert repo_findings(tmp_path, {"train.py": text}, "GT006") == [("train.py", 20)]
