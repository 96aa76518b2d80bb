"""``gpu-training lint`` ``GT019``: bf16 parameters reach ``torch.optim.Adam`` through a method chain, and
the optimizer is stepped by the project's own trainer class.

Issue 33, set 13: a student loaded with ``from_pretrained(..., torch_dtype=torch.bfloat16).to("cuda")``
(``.to(device)`` keeps the dtype), sharded with FSDP2 ``fully_shard`` + ``MixedPrecisionPolicy``
(which keeps the module's bf16 parameters), and the ``Adam`` built over it handed to a trainer
class of another module whose base class runs ``backward``/``optim.step()``. Minimal
reproductions written here, with variants; not reported: a chain that ends in fp32, an optimizer
only handed to a checkpoint loader.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_TRAINER_MODULE = """\
class BaseTrainer:
    def __init__(self, model, optim):
        self.model = model
        self.optim = optim

    def train_step(self, batch):
        loss = self.compute_loss(batch)
        loss.backward()
        self.optim.step()
        self.optim.zero_grad()


class DistillTrainer(BaseTrainer):
    def __init__(self, model, optim, teacher):
        super().__init__(model, optim)
        self.teacher = teacher

    def compute_loss(self, batch):
        return self.model(**batch).loss
"""

_FSDP2_MAIN = """\
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM

from trainer import DistillTrainer


def run(name, loader, teacher):
    student = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16).to("cuda")
    fully_shard(student, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    optim = torch.optim.Adam(student.parameters(), lr=1e-5)
    trainer = DistillTrainer(student, optim, teacher)
    for batch in loader:
        trainer.train_step(batch)


run("Qwen/Qwen2.5-0.5B", [], None)
"""

_CHAINED_DDP = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import AutoModel


def train(local_rank, loader):
    dist.init_process_group("nccl")
    net = AutoModel.from_pretrained("bert-base", torch_dtype=torch.bfloat16).cuda().train()
    ddp = DDP(net, device_ids=[local_rank])
    opt = torch.optim.AdamW(net.parameters(), lr=2e-5)
    for batch in loader:
        ddp(**batch).loss.backward()
        opt.step()


if __name__ == "__main__":
    train(0, [])
"""


def _gt019(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT019")


def test_an_optimizer_stepped_by_the_projects_trainer_class(tmp_path: Path) -> None:
    files = {"trainer.py": _TRAINER_MODULE, "main.py": _FSDP2_MAIN}
    assert _gt019(tmp_path, files) == [("main.py", 11)]


def test_an_optimizer_only_loaded_into_is_not_stepped(tmp_path: Path) -> None:
    loader_only = _FSDP2_MAIN.replace(
        "    trainer = DistillTrainer(student, optim, teacher)\n"
        "    for batch in loader:\n"
        "        trainer.train_step(batch)\n",
        "    restore(student, optim)\n",
    ).replace("from trainer import DistillTrainer\n", "from ckpt import restore\n")
    files = {"ckpt.py": "def restore(model, optim):\n    optim.load_state_dict({})\n"}
    assert _gt019(tmp_path, {**files, "main.py": loader_only}) == []


def test_a_bf16_load_through_cuda_and_train(tmp_path: Path) -> None:
    assert _gt019(tmp_path, {"train.py": _CHAINED_DDP}) == [("train.py", 11)]


def test_a_chain_that_ends_in_fp32_keeps_master_weights(tmp_path: Path) -> None:
    text = _CHAINED_DDP.replace(".cuda().train()", ".cuda().to(torch.float32)")
    assert _gt019(tmp_path, {"train.py": text}) == []
