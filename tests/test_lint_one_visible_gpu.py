"""``gpu-training lint``: a script that makes one literal GPU visible runs as one process (``GT002``).

``os.environ["CUDA_VISIBLE_DEVICES"] = "1"`` names the same single GPU for every process that
runs the file, so the file cannot run as several ranks (NCCL refuses two ranks on one GPU, and
``set_device(local_rank)`` has no device 1 to pin): its ``cuda:0`` is the GPU it chose, and
``GT002`` does not apply. Minimal reproductions written here (issue 33, set 13: an interactive
DeepSpeed inference script that calls ``init_distributed``), and variants in other spellings.
A value naming several GPUs keeps the finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_training.diagnostics.lint.report import lint_paths

_DEEPSPEED_CHAT = """\
import os
import deepspeed
import torch
from transformers import AutoModelForCausalLM

os.environ["CUDA_VISIBLE_DEVICES"] = {value}
world_size = int(os.getenv("WORLD_SIZE", "1"))
deepspeed.init_distributed("nccl")


class Chat:
    def __init__(self, name, device=torch.device("cuda:0")):
        self.device = device
        with deepspeed.OnDevice(dtype=torch.float16, device="cuda:0"):
            model = AutoModelForCausalLM.from_pretrained(name).half()
        self.model = deepspeed.init_inference(model, mp_size=world_size)

    def loop(self):
        while True:
            ids = torch.tensor([[1, 2]]).to(self.device)
            print(self.model.generate(ids))


Chat("out/best", device=torch.device("cuda:0")).loop()
"""

_DDP_PUTENV = """\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

{set_env}
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:23456", rank=0, world_size=1)
model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[0])
x = torch.randn(8, 4).cuda()
model(x).sum().backward()
"""

_FABRIC_STYLE = """\
import os
import torch
import torch.distributed as dist


def main():
    os.environ.update({env})
    dist.init_process_group(backend="nccl")
    net = torch.nn.Linear(4, 1).to("cuda:0")
    batch = torch.randn(2, 4, device="cuda")
    net(batch).mean().backward()


if __name__ == "__main__":
    main()
"""


def _gt002(tmp_path: Path, text: str) -> list[int]:
    (tmp_path / "script.py").write_text(text)
    return sorted(f.line for f in lint_paths([tmp_path]).findings if f.code == "GT002")


@pytest.mark.parametrize("value", ["'1'", "'3'", "2"])
def test_one_literal_gpu_makes_cuda0_the_scripts_own(tmp_path: Path, value: str) -> None:
    assert _gt002(tmp_path, _DEEPSPEED_CHAT.format(value=value)) == []


def test_several_visible_gpus_keep_the_fixed_device(tmp_path: Path) -> None:
    assert _gt002(tmp_path, _DEEPSPEED_CHAT.format(value="'0,1'")) != []


@pytest.mark.parametrize(
    "set_env",
    [
        'os.putenv("CUDA_VISIBLE_DEVICES", "0")',
        'os.environ.setdefault("CUDA_VISIBLE_DEVICES", "5")',
        'os.environ.update(CUDA_VISIBLE_DEVICES="1")',
    ],
)
def test_other_spellings_of_one_visible_gpu(tmp_path: Path, set_env: str) -> None:
    text = _DDP_PUTENV.format(set_env=set_env).replace(", rank=0, world_size=1", "")
    assert _gt002(tmp_path, text) == []


def test_a_dict_update_naming_one_gpu(tmp_path: Path) -> None:
    assert _gt002(tmp_path, _FABRIC_STYLE.format(env='{"CUDA_VISIBLE_DEVICES": "1"}')) == []
    assert _gt002(tmp_path, _FABRIC_STYLE.format(env='{"CUDA_VISIBLE_DEVICES": "0,1"}')) != []


def test_a_computed_value_is_not_one_literal_gpu(tmp_path: Path) -> None:
    text = _FABRIC_STYLE.format(env='{"CUDA_VISIBLE_DEVICES": os.environ["GPUS"]}')
    assert _gt002(tmp_path, text) != []


def test_a_file_that_pins_each_rank_keeps_its_fixed_device_ids(tmp_path: Path) -> None:
    """The literal is a leftover of a one-GPU run: the file itself picks a GPU per rank."""
    text = _DDP_PUTENV.format(set_env='os.environ["CUDA_VISIBLE_DEVICES"] = "3"').replace(
        "rank=0, world_size=1)",
        "rank=int(os.environ['RANK']), world_size=2)\n"
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
    )
    assert _gt002(tmp_path, text) == [9]
