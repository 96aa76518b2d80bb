"""``gpu-training lint`` ``GT001``: ``DataParallel`` in a model file's ``__main__`` smoke test.

A model definition file ends with ``if __name__ == "__main__":``: build the network, wrap it
in ``nn.DataParallel``, run one forward on a random tensor and print shapes or a parameter
summary. The file trains nothing and builds no optimizer: there are no gradients to gather,
so ``DataParallel``'s training cost does not arise. A ``__main__`` block that trains (or
builds an optimizer for a library's fit loop) keeps the finding. Minimal reproductions written
here (issue 33, set 14: segmentation model files with a DataParallel self-test).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_MODEL = """\
import torch
import torch.nn as nn


class SegNet(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.head = nn.Conv2d(3, classes, 1)

    def forward(self, x):
        return self.head(x)


"""

_SMOKE = {
    "forward_and_print": (
        "if __name__ == '__main__':\n    net = SegNet(8).cuda()\n    net.train()\n"
        "    net = nn.DataParallel(net)\n    out = net(torch.randn(2, 3, 64, 64).cuda())\n"
        "    print(out.shape)\n"
    ),
    "summary_helper": (
        "def count_params(model):\n    return sum(p.numel() for p in model.parameters())\n\n\n"
        'if "__main__" == __name__:\n'
        "    model = torch.nn.DataParallel(SegNet(4), device_ids=[0, 1]).cuda()\n"
        "    print(count_params(model), model(torch.zeros(1, 3, 32, 32).cuda()).shape)\n"
    ),
    "no_grad_free_benchmark": (
        "if __name__ == '__main__':\n    import time\n\n    m = nn.DataParallel(SegNet(2).cuda())\n"
        "    t = time.time()\n    for _ in range(10):\n        m(torch.randn(4, 3, 128, 128).cuda())\n"
        "    print(time.time() - t)\n"
    ),
}

_TRAINS = {
    "backward": (
        "if __name__ == '__main__':\n    net = nn.DataParallel(SegNet(8).cuda())\n"
        "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "    loss = net(torch.randn(2, 3, 8, 8).cuda()).mean()\n    loss.backward()\n"
        "    opt.step()\n"
    ),
    "library_fit": (
        "from trainer_lib import fit\n\n"
        "if __name__ == '__main__':\n    net = nn.DataParallel(SegNet(8).cuda())\n"
        "    fit(net, torch.optim.AdamW(net.parameters()), epochs=3)\n"
    ),
}


def _codes(tmp_path: Path, source: str) -> set[str]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "segnet.py").write_text(source)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {f.code for f in report.findings}


@pytest.mark.parametrize("case", sorted(_SMOKE))
def test_a_dataparallel_smoke_test_is_not_gt001(tmp_path: Path, case: str) -> None:
    assert "GT001" not in _codes(tmp_path, _MODEL + _SMOKE[case])


@pytest.mark.parametrize("case", sorted(_TRAINS))
def test_a_main_block_that_trains_keeps_gt001(tmp_path: Path, case: str) -> None:
    assert "GT001" in _codes(tmp_path, _MODEL + _TRAINS[case])
