"""``gpu-training lint``: a rank guard through a helper that asks whether a group exists, and
``GT019`` through a loader helper that moves the model before returning it.

Issue 33, held-back set 23 (a public SFT repository): ``def is_dist(): return
dist.is_available() and dist.is_initialized()`` and ``def is_main(): return not is_dist() or
dist.get_rank() == 0``. ``not is_dist()`` holds only without a process group, so ``is_main()``
is rank 0 of a distributed run, as ``not dist.is_initialized() or dist.get_rank() == 0`` is; the
lint read the helper as no guard and reported every save under it (``GT007``, four false
findings). The same script loads the model with ``torch_dtype=torch.bfloat16 if args.bf16
else ...`` (``--bf16`` on by default) in ``build_model``, which returns ``model.to(device)``,
and steps it with ``torch.optim.AdamW`` (``GT019``, missed: the ``.to(device)`` hid the model).
Minimal reproductions written here, with the variants that stay quiet.
"""

from __future__ import annotations

from pathlib import Path

from lint_repo import repo_findings

_GUARDS = """\
import torch
import torch.distributed as dist


def is_dist():
    return dist.is_available() and dist.is_initialized()


def is_main():
    return not is_dist() or dist.get_rank() == 0


def save_model(model, path):
    torch.save(model.state_dict(), path)


def main():
    dist.init_process_group("nccl")
    model = torch.nn.Linear(2, 2)
    if is_main():
        save_model(model, "a.pt")
    if is_main():
        torch.save(model.state_dict(), "b.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def test_a_guard_through_a_helper_that_asks_for_the_group(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _GUARDS}, "GT007") == []


def test_a_helper_that_asks_something_else_is_no_group_query(tmp_path: Path) -> None:
    text = _GUARDS.replace(
        "    return dist.is_available() and dist.is_initialized()",
        "    return dist.is_available() and torch.cuda.is_available() and flag()",
    )
    found = repo_findings(tmp_path, {"train.py": text}, "GT007")
    assert found == [("train.py", 14), ("train.py", 23)]


_BF16 = """\
import argparse

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM


def build_model(args, device):
    dtype = torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained("gpt2", torch_dtype=dtype)
    return model.to(device)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    model = build_model(args, "cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.zeros(1)).loss.backward()
    optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def test_a_bf16_model_returned_moved_to_its_device(tmp_path: Path) -> None:
    assert repo_findings(tmp_path, {"train.py": _BF16}, "GT019") == [("train.py", 21)]


def test_a_model_returned_converted_back_to_fp32(tmp_path: Path) -> None:
    text = _BF16.replace("    return model.to(device)", "    return model.to(torch.float32)")
    assert repo_findings(tmp_path, {"train.py": text}, "GT019") == []


def test_a_project_loader_given_a_bf16_torch_dtype(tmp_path: Path) -> None:
    text = _BF16.replace(
        'AutoModelForCausalLM.from_pretrained("gpt2", torch_dtype=dtype)',
        'MyModel.load_pretrained_blocks("gpt2", torch_dtype=dtype)',
    ).replace("from transformers import AutoModelForCausalLM\n", "from mymodel import MyModel\n")
    files = {"train.py": text, "mymodel.py": "class MyModel:\n    pass\n"}
    assert repo_findings(tmp_path, files, "GT019") == [("train.py", 21)]
