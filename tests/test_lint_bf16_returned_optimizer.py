"""``gpu-training lint`` ``GT019``: a helper module builds the Adam optimizer over a bf16 model
that another module hands it, and returns it to that module, which steps it.

Issue 33, set 19: ``model, tok = setup_model(name)`` (``from_pretrained(...,
torch_dtype=torch.bfloat16)`` in ``core/training.py``), ``model = FSDP(model,
mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, ...))`` (FSDP1 keeps the flat
parameters in the module's own bf16), then ``optimizer = get_optimizer(model, lr, wd)``, a
helper of ``core/training.py`` that returns ``torch.optim.AdamW(groups)``; the entry script
runs the backward and the step. Minimal reproductions written here, with variants (DDP, a
``.to(torch.bfloat16)`` conversion, keyword arguments); not reported: an fp32 model, and an
optimizer whose caller never trains.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_HELPERS = """\
import torch
import torch.distributed as dist
import transformers


def setup_model(name):
    model = transformers.AutoModelForCausalLM.from_pretrained(name, torch_dtype={dtype})
    return model, transformers.AutoTokenizer.from_pretrained(name)


def get_optimizer(model, lr, weight_decay):
    groups = [
        {"params": [p for n, p in model.named_parameters() if "bias" not in n], "weight_decay": weight_decay},
        {"params": [p for n, p in model.named_parameters() if "bias" in n], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def mean_loss(loss):
    dist.all_reduce(loss)
    return loss / dist.get_world_size()
"""

_FSDP_MAIN = """\
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision

from core.training import get_optimizer, mean_loss, setup_model

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model, tokenizer = setup_model("llama")
model = FSDP(
    model,
    mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16),
    device_id=torch.cuda.current_device(),
)
optimizer = get_optimizer({call_args})
for batch in build_loader(tokenizer):
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(mean_loss(loss.detach()))
dist.destroy_process_group()
"""

_DDP_MAIN = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from core import training


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    net = build_net().to(torch.bfloat16).cuda()
    net = DDP(net, device_ids=[rank])
    opt = training.get_optimizer(net, 1e-4, 0.1)
    for x in build_loader():
        opt.zero_grad()
        net(x).float().mean().backward()
        opt.step()


main()
"""


def _gt019(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT019")


@pytest.mark.parametrize(
    "call_args", ["model, 1e-5, 0.1", "model=model, lr=1e-5, weight_decay=0.1"]
)
def test_fsdp_bf16_model_handed_to_a_returning_helper(tmp_path: Path, call_args: str) -> None:
    files = {
        "train.py": _FSDP_MAIN.replace("{call_args}", call_args),
        "core/__init__.py": "",
        "core/training.py": _HELPERS.replace("{dtype}", "torch.bfloat16"),
    }
    assert _gt019(tmp_path, files) == [("training.py", 16)]


def test_fsdp_fp32_model(tmp_path: Path) -> None:
    files = {
        "train.py": _FSDP_MAIN.replace("{call_args}", "model, 1e-5, 0.1"),
        "core/__init__.py": "",
        "core/training.py": _HELPERS.replace("{dtype}", "torch.float32"),
    }
    assert _gt019(tmp_path, files) == []


def test_ddp_bf16_conversion_handed_to_a_returning_helper(tmp_path: Path) -> None:
    files = {
        "train.py": _DDP_MAIN,
        "core/__init__.py": "",
        "core/training.py": _HELPERS.replace("{dtype}", "torch.float32"),
    }
    assert _gt019(tmp_path, files) == [("training.py", 16)]


def test_optimizer_returned_to_a_caller_that_never_trains(tmp_path: Path) -> None:
    text = _DDP_MAIN.replace(
        "    for x in build_loader():\n"
        "        opt.zero_grad()\n"
        "        net(x).float().mean().backward()\n"
        "        opt.step()\n",
        "    print(opt)\n",
    )
    files = {
        "inspect_opt.py": text,
        "core/__init__.py": "",
        "core/training.py": _HELPERS.replace("{dtype}", "torch.float32"),
    }
    assert _gt019(tmp_path, files) == []
