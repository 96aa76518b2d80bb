"""``gpu-training lint`` ``GT019`` is reported in scripts that run distributed.

Issue 33, set 15: a top-level single-process script (its own ``__main__``, ``device =
"cuda"``, no process group, no launcher, its ``dist`` a probability distribution) steps a
bf16 model with ``torch.optim.Adam``. The linter checks distributed training scripts; the
truth readers judged ``GT019`` where a multi-process launch runs the file, so a file that no
process group, launcher or framework reaches is not reported. The same optimizer in a
script that joins a group still is (a DeepSpeed script stays the catalogue's exclusion). Minimal reproductions written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_ONE_PROCESS = """\
import torch
from torch.distributions import Categorical
from transformers import AutoModel


def train(name, batches):
    device = "cuda"
    model = AutoModel.from_pretrained(name, torch_dtype=torch.bfloat16).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    for batch in batches:
        dist = Categorical(logits=model(batch.to(device)))
        loss = -dist.log_prob(dist.sample()).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    train("some/model", [])
"""

_SETUPS = {
    "ddp": (
        "import torch.distributed as torch_dist\n",
        "    torch_dist.init_process_group('nccl')\n",
    ),
    "torchrun_env": (
        "import os\nfrom torch.distributed import init_process_group\n",
        "    init_process_group(backend='nccl')\n"
        "    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n",
    ),
}


def _codes(tmp_path: Path, source: str) -> set[str]:
    (tmp_path / ".git").mkdir()
    (tmp_path / "reinforce.py").write_text(source)
    report = lint_paths([tmp_path])
    assert not report.errors, report.errors
    return {f.code for f in report.findings}


def test_a_single_process_bf16_adam_script_is_not_gt019(tmp_path: Path) -> None:
    assert "GT019" not in _codes(tmp_path, _ONE_PROCESS)


def test_a_model_cast_with_bfloat16_in_one_process_is_not_gt019(tmp_path: Path) -> None:
    source = _ONE_PROCESS.replace(
        "from_pretrained(name, torch_dtype=torch.bfloat16).to(device)",
        "from_pretrained(name).bfloat16().to(device)",
    ).replace("torch.optim.Adam(", "torch.optim.AdamW(")
    assert "GT019" not in _codes(tmp_path, source)


@pytest.mark.parametrize("setup", sorted(_SETUPS))
def test_the_same_script_under_a_process_group_is_gt019(tmp_path: Path, setup: str) -> None:
    imports, call = _SETUPS[setup]
    source = imports + _ONE_PROCESS.replace('    device = "cuda"\n', call + '    device = "cuda"\n')
    assert "GT019" in _codes(tmp_path, source)
