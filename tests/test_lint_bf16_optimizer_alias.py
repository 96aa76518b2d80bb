"""``gpu-training lint`` ``GT019``: the Adam class reached through a name, ``functools.partial``
or a conditional expression.

Issue 33, set 15 (missed there): a script hard-casts its model with ``m = m.bfloat16()`` on
one branch and steps it with ``opt_cls(param_groups, lr=...)``, where ``opt_cls =
functools.partial(torch.optim.AdamW, betas=...) if args.optim == 'adamw' else
torch.optim.SGD`` (AdamW by default). The rule looked for ``torch.optim.AdamW(...)`` written
out, so every alias of the class hid the bf16 update. Minimal reproductions written here;
not reported: an alias of another optimizer, a partial of a project function.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lint_repo import repo_findings

_SCRIPT = """\
import functools
from functools import partial

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
model = Net()
if dist.get_world_size() == 1:
    model = model.bfloat16()
groups = [{"params": p} for p in split(model)]
opt_cls = {alias}
opt = opt_cls(groups, lr=1e-4)
for x in loader:
    loss = model(x).sum()
    loss.backward()
    opt.step()
dist.destroy_process_group()
"""


def _found(tmp_path: Path, alias: str) -> list[tuple[str, int]]:
    return repo_findings(tmp_path, {"train.py": _SCRIPT.replace("{alias}", alias)}, "GT019")


@pytest.mark.parametrize(
    "alias",
    [
        "torch.optim.AdamW",
        "functools.partial(torch.optim.AdamW, betas=(0.9, 0.95))",
        "partial(torch.optim.Adam, weight_decay=0.0)",
        "functools.partial(torch.optim.AdamW) if args.optim == 'adamw' else torch.optim.SGD",
        "torch.optim.SGD if args.sgd else torch.optim.AdamW",
    ],
    ids=["name", "partial", "from-import-partial", "conditional-partial", "conditional-else"],
)
def test_adam_under_another_name_steps_bf16_parameters(tmp_path: Path, alias: str) -> None:
    assert _found(tmp_path, alias) == [("train.py", 13)]


@pytest.mark.parametrize(
    "alias",
    [
        "torch.optim.SGD",
        "functools.partial(torch.optim.SGD, momentum=0.9)",
        "functools.partial(make_optimizer, kind='adamw')",
        "torch.optim.SGD if args.sgd else bnb.optim.AdamW8bit",
    ],
    ids=["sgd", "partial-sgd", "partial-of-a-project-function", "neither-is-torch-adam"],
)
def test_other_optimizers_under_a_name_are_not_adam(tmp_path: Path, alias: str) -> None:
    assert _found(tmp_path, alias) == []


_ACCELERATE = """\
import torch
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="bf16")
model = Net().to(dtype=torch.bfloat16)
if args.use_8bit_adam:
    import bitsandbytes as bnb

    optimizer_cls = bnb.optim.AdamW8bit
else:
    optimizer_cls = torch.optim.AdamW
optimizer = optimizer_cls(model.parameters(), lr=1e-4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    accelerator.backward(model(batch).sum())
    optimizer.step()
"""


@pytest.mark.parametrize(
    ("distributed_type", "found"),
    [("DEEPSPEED", []), ("MULTI_GPU", [("train.py", 12)])],
    ids=["deepspeed-config", "ddp-config"],
)
def test_an_accelerate_deepspeed_config_keeps_fp32_master_weights(
    tmp_path: Path, distributed_type: str, found: list[tuple[str, int]]
) -> None:
    # Set 4's reading: the repository's only Accelerate config is DeepSpeed ZeRO-2, which
    # keeps fp32 master weights of the bf16 model (the alias made the rule see it at all)
    config = f"distributed_type: {distributed_type}\nnum_processes: 8\nmixed_precision: bf16\n"
    files = {"train.py": _ACCELERATE, "accelerate_config.yaml": config}
    assert repo_findings(tmp_path, files, "GT019") == found


_ADAPTERS = """\
import torch
import torch.distributed as dist
from peft import LoraConfig, PeftModel, get_peft_model, inject_adapter_in_model

dist.init_process_group("nccl")
model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
{wrap}
optimizer = torch.optim.AdamW(filter(lambda p: p.requires_grad, model.parameters()), lr=1e-4)
for batch in loader:
    model(**batch).loss.backward()
    optimizer.step()
dist.destroy_process_group()
"""


@pytest.mark.parametrize(
    ("wrap", "found"),
    [
        ("model = get_peft_model(model, LoraConfig(r=8))", []),
        ("peft_model = get_peft_model(model, LoraConfig(r=8))", []),
        ("model = PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)", []),
        ("model = inject_adapter_in_model(LoraConfig(r=8), model)", [("train.py", 8)]),
        ("model.add_adapter(LoraConfig(r=8))", [("train.py", 8)]),
        # a LoRA branch beside a full fine-tune: the full one steps the bf16 weights (set 5)
        ("if args.lora:\n    model = get_peft_model(model, LoraConfig(r=8))", [("train.py", 9)]),
        # the adapters cast to the base's dtype after the wrapping (set 19)
        (
            "model = get_peft_model(model, LoraConfig(r=8))\n"
            "for param in model.parameters():\n"
            "    if param.requires_grad:\n"
            "        param.data = param.data.to(torch.bfloat16)",
            [("train.py", 11)],
        ),
    ],
    ids=[
        "get-peft-model",
        "get-peft-model-new-name",
        "peft-from-pretrained",
        "inject",
        "add-adapter",
        "lora-branch",
        "adapters-cast-to-bf16",
    ],
)
def test_peft_adapters_over_a_bf16_base_are_fp32_only_through_get_peft_model(
    tmp_path: Path, wrap: str, found: list[tuple[str, int]]
) -> None:
    # peft 0.21 measured: get_peft_model over a bf16 model makes float32 adapters (its
    # autocast_adapter_dtype); inject_adapter_in_model (diffusers' add_adapter) makes them in
    # the base layer's bfloat16, and Adam then steps bf16 adapters
    source = _ADAPTERS.replace("{wrap}", wrap)
    assert repo_findings(tmp_path, {"train.py": source}, "GT019") == found
