"""``gpu-training lint`` ``GT019``: bf16 set through a run's configuration, not spelled out.

Issue 33, set 18: the dtype is chosen from a precision setting (``self.dtype = torch.bfloat16``
under ``if precision == "bf16":``, the parameter defaulting to ``"bf16"``) and the model cast
with ``model.to(device, dtype=self.dtype)`` inside a trainer class, the optimizer built over a
``self`` list of its parameters; a loader helper of another module puts ``torch_dtype`` in a
keyword dict under ``if use_mp:`` and returns ``model, tokenizer``; a model class casts itself
to bf16 at the end of its ``__init__`` and is a field of a config dataclass, in a Fabric
script whose Fabric is only seen through an annotation. Minimal reproductions written here,
with variants (DDP, FSDP, Accelerate, Fabric); not reported: a run launched under DeepSpeed by
the repository's Accelerate config, a helper that loads in fp32, a class that casts itself to
fp32.
"""

from __future__ import annotations

import ast
from pathlib import Path

from gpu_training.diagnostics.lint.frameworks import file_framework
from gpu_training.diagnostics.lint.model import ModuleFacts
from lint_repo import repo_findings

_ACCELERATE_TRAINER = """\
import torch
from accelerate import Accelerator, DistributedType


class ReconTrainer:
    def __init__(self, model, loader, mixed_precision: str = "bf16"):
        self.precision = mixed_precision
        if self.precision == "fp16":
            self.dtype = torch.float16
        elif self.precision == "bf16":
            self.dtype = torch.bfloat16
        else:
            self.dtype = torch.float32
        self.accelerator = Accelerator(mixed_precision=self.precision)
        self.model = model
        self.model.train()
        self.model.to(self.accelerator.device, dtype=self.dtype)
        self.params_to_optimize = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params_to_optimize, lr=1e-4)
        self.model, self.optimizer, self.loader = self.accelerator.prepare(
            self.model, self.optimizer, loader
        )

    def save_hook(self, models, weights, output_dir):
        if self.accelerator.distributed_type == DistributedType.DEEPSPEED or (
            self.accelerator.is_main_process
        ):
            torch.save(models[0].state_dict(), output_dir)

    def train(self):
        for batch in self.loader:
            loss = self.model(batch).mean()
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
"""

_MULTI_GPU = "distributed_type: MULTI_GPU\nnum_processes: 4\nmixed_precision: bf16\n"
_DEEPSPEED = "distributed_type: DEEPSPEED\nnum_processes: 4\ndeepspeed_config:\n  zero_stage: 2\n"

_LOADER_MODULE = """\
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def load_model_and_tokenizer(path, use_mp, local_rank):
    model_args = {"use_cache": False}
    if use_mp:
        model_args["torch_dtype"] = torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(path, **model_args)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
"""

_FSDP_MAIN = """\
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.optim import AdamW

from loading import load_model_and_tokenizer


def main(cfg, loader):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    model, tokenizer = load_model_and_tokenizer(cfg.path, cfg.use_mp, local_rank)
    model = FSDP(model, device_id=local_rank)
    optimizer = AdamW(model.parameters(), lr=2e-5)
    for batch in loader:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main(None, [])
"""

_NESTED_LOADER = """\
import torch
from transformers import AutoModel

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _load(name, precision):
    load_args = dict(torch_dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[precision])
    return AutoModel.from_pretrained(name, **load_args)


def build(cfg):
    encoder = _load(cfg.name, cfg.precision)
    return encoder
"""

_DDP_MAIN = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from models import build


def train(cfg, loader, local_rank):
    dist.init_process_group("nccl")
    net = build(cfg).cuda()
    ddp = DDP(net, device_ids=[local_rank])
    opt = torch.optim.Adam(net.parameters(), lr=1e-5)
    for batch in loader:
        ddp(batch).sum().backward()
        opt.step()


if __name__ == "__main__":
    train(None, [], 0)
"""

_SELF_CAST_MODEL = """\
import torch
from torch import nn


class SetEncoder(nn.Module):
    def __init__(self, size: str):
        super().__init__()
        self.phi = nn.Linear(8, 8)
        self.dtype = torch.bfloat16
        self.to(dtype=self.dtype)

    def hot_parameters(self):
        return (p for p in self.parameters() if p.requires_grad)
"""

_FABRIC_ORCHESTRATOR = """\
from dataclasses import dataclass

from lightning_fabric import Fabric
from torch import optim

from encoder import SetEncoder
from launching import launch_fabric


@dataclass
class TrainConfig:
    model: SetEncoder = SetEncoder("16k")
    learning_rate: float = 1e-4


class Orchestrator:
    def __init__(self, config: TrainConfig):
        self.config = config
        self.fabric: Fabric | None = None

    def setup(self):
        self.fabric = launch_fabric()
        model = self.config.model
        optimizer = optim.AdamW(params=model.hot_parameters(), lr=self.config.learning_rate)
        self.model, self.optimizer = self.fabric.setup(model, optimizer)

    def step(self, batch):
        loss = self.model(batch).sum()
        self.fabric.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
"""

# a helper module the linter cannot parse (newer syntax): its Fabric is not seen there
_UNPARSED_LAUNCHER = "def launch_fabric[T]() -> T:\n    return Fabric(devices=2)\n"

_IFEXP_DDP = """\
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = Net().to("cuda", dtype)
    ddp = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for batch in loader():
        ddp(batch).sum().backward()
        opt.step()


if __name__ == "__main__":
    main()
"""


def _gt019(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    return repo_findings(root, files, "GT019")


def test_a_trainer_class_casting_to_its_configured_dtype(tmp_path: Path) -> None:
    files = {"trainer.py": _ACCELERATE_TRAINER, "configs/node.yaml": _MULTI_GPU}
    assert _gt019(tmp_path, files) == [("trainer.py", 19)]


def test_the_same_trainer_launched_under_deepspeed_keeps_master_weights(tmp_path: Path) -> None:
    files = {"trainer.py": _ACCELERATE_TRAINER, "configs/zero2.yaml": _DEEPSPEED}
    assert _gt019(tmp_path, files) == []


def test_a_loader_helper_returning_a_bf16_model_in_a_tuple(tmp_path: Path) -> None:
    files = {"loading.py": _LOADER_MODULE, "main.py": _FSDP_MAIN}
    assert _gt019(tmp_path, files) == [("main.py", 16)]


def test_a_loader_helper_in_fp32_is_not_reported(tmp_path: Path) -> None:
    fp32 = _LOADER_MODULE.replace("torch.bfloat16", "torch.float32")
    assert _gt019(tmp_path, {"loading.py": fp32, "main.py": _FSDP_MAIN}) == []


def test_a_helper_of_a_helper_with_a_dict_of_dtypes(tmp_path: Path) -> None:
    files = {"models.py": _NESTED_LOADER, "train.py": _DDP_MAIN}
    assert _gt019(tmp_path, files) == [("train.py", 12)]


def test_a_model_class_casting_itself_held_by_a_config(tmp_path: Path) -> None:
    files = {
        "encoder.py": _SELF_CAST_MODEL,
        "orchestrator.py": _FABRIC_ORCHESTRATOR,
        "launching.py": _UNPARSED_LAUNCHER,
    }
    assert _gt019(tmp_path, files) == [("orchestrator.py", 24)]


def test_a_model_class_casting_itself_to_fp32_is_not_reported(tmp_path: Path) -> None:
    files = {
        "encoder.py": _SELF_CAST_MODEL.replace("torch.bfloat16", "torch.float32"),
        "orchestrator.py": _FABRIC_ORCHESTRATOR,
        "launching.py": _UNPARSED_LAUNCHER,
    }
    assert _gt019(tmp_path, files) == []


def test_a_self_casting_class_built_directly(tmp_path: Path) -> None:
    main = _DDP_MAIN.replace("from models import build", "from encoder import SetEncoder")
    main = main.replace("build(cfg).cuda()", "SetEncoder('1k').cuda()")
    files = {"encoder.py": _SELF_CAST_MODEL, "train.py": main}
    assert _gt019(tmp_path, files) == [("train.py", 12)]


def test_a_dtype_picked_by_a_flag(tmp_path: Path) -> None:
    assert _gt019(tmp_path, {"train.py": _IFEXP_DDP}) == [("train.py", 16)]


def test_a_framework_seen_only_through_an_annotation() -> None:
    facts = ModuleFacts(ast.parse(_FABRIC_ORCHESTRATOR))
    assert file_framework({"setup", "launch_fabric"}, facts) == "fabric"
    accelerate = "from accelerate import Accelerator\ndef step(acc: Accelerator):\n    pass\n"
    assert file_framework(set(), ModuleFacts(ast.parse(accelerate))) == "accelerate"
    assert file_framework(set(), ModuleFacts(ast.parse("def f(x: Fabric): pass\n"))) is None


_OPTIMIZER_HELPER = """\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM


def setup_model(name):
    return AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)


def get_optimizer(model, lr):
    groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    return torch.optim.AdamW(params=groups, lr=lr)


def main(loader):
    dist.init_process_group("nccl")
    model = setup_model("mistralai/Mistral-7B-v0.1")
    model = FSDP(model)
    optimizer = get_optimizer(model, 2e-5)
    for batch in loader:
        model(**batch).loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main([])
"""


def test_an_optimizer_helper_handed_a_bf16_model(tmp_path: Path) -> None:
    assert _gt019(tmp_path, {"train.py": _OPTIMIZER_HELPER}) == [("train.py", 13)]


def test_an_optimizer_helper_handed_an_fp32_model(tmp_path: Path) -> None:
    fp32 = _OPTIMIZER_HELPER.replace("torch.bfloat16", "torch.float32")
    assert _gt019(tmp_path, {"train.py": fp32}) == []


_ADAPTER = """
import itertools

import torch
from transformers import CLIPVisionModelWithProjection


class Projection(torch.nn.Module):
    def __init__(self, width, tokens):
        super().__init__()
        self.proj = torch.nn.Linear(width, width * tokens)


def main(accelerator):
    encoder = CLIPVisionModelWithProjection.from_pretrained("openai/clip")
    encoder.requires_grad_(False)
    projection = Projection(width=encoder.config.projection_dim, tokens=4)
    weight_dtype = torch.float32
    if accelerator.mixed_precision == "bf16":
        weight_dtype = torch.bfloat16
    encoder.to(accelerator.device, dtype=weight_dtype)
    return torch.optim.AdamW(itertools.chain(PARAMS), lr=1e-4)
"""


def test_a_number_read_off_a_bf16_module_carries_none_of_its_parameters() -> None:
    """A frozen encoder cast to bf16 whose width sizes a trained projection (diffusers'
    IP-Adapter tutorials): the optimizer steps the projection, in fp32, only."""
    from gpu_training.diagnostics.lint.precision import bf16_adam

    trained = ModuleFacts(ast.parse(_ADAPTER.replace("PARAMS", "projection.parameters()")))
    assert bf16_adam(trained) == []
    both = "projection.parameters(), encoder.parameters()"
    stepped = ModuleFacts(ast.parse(_ADAPTER.replace("PARAMS", both)))
    assert [call.lineno for call, _ in bf16_adam(stepped)] == [22]
