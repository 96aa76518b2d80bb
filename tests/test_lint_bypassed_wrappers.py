"""``gpu-training lint``: accumulation whose forward bypasses the DDP wrapper is not ``GT013``.

``DistributedDataParallel`` all-reduces a backward's gradients only when the forward ran
through the wrapper. A script that wraps ``policy`` but computes its loss with
``policy.compute_loss(batch)`` (or ``criterion(base(x), y)``) has no all-reduce per
micro-batch for ``no_sync()`` to skip: ``GT013`` does not describe it. The same loop with
the forward through the wrapper stays ``GT013``. Minimal reproductions written here (issue
33, set 13).
"""

from __future__ import annotations

import pytest

from gpu_training.diagnostics.lint import lint_source

_LOOP = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(policy, loaders, accum, rank):
    dist.init_process_group("nccl")
    model = DDP(policy, device_ids=[rank])
    optimizer = torch.optim.AdamW(model.parameters())
    for batches in loaders:
        optimizer.zero_grad()
        for _ in range(accum):
            x, y = next(batches)
{forward}
            (loss / accum).backward()
        optimizer.step()
    dist.destroy_process_group()
"""

_BYPASSING = {
    "method_of_the_inner_module": "            loss, logs = policy.compute_loss(x)",
    "inner_module_inside_the_criterion": (
        "            loss = torch.nn.functional.mse_loss(policy(x), y)"
    ),
    "annotated": "            loss: torch.Tensor = policy.loss_fn(x, y)",
}

_THROUGH_THE_WRAPPER = {
    "wrapper_call": "            loss = torch.nn.functional.mse_loss(model(x), y)",
    "wrapper_then_criterion": (
        "            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)"
    ),
}


def _gt013(forward: str) -> list[int]:
    return [f.line for f in lint_source(_LOOP.format(forward=forward)) if f.code == "GT013"]


@pytest.mark.parametrize("case", sorted(_BYPASSING))
def test_a_forward_on_the_wrapped_module_is_not_gt013(case: str) -> None:
    assert _gt013(_BYPASSING[case]) == []


@pytest.mark.parametrize("case", sorted(_THROUGH_THE_WRAPPER))
def test_a_forward_through_the_wrapper_is_gt013(case: str) -> None:
    assert _gt013(_THROUGH_THE_WRAPPER[case]) != []


def test_a_module_rebound_to_its_wrapper_is_gt013() -> None:
    rebound = _LOOP.replace("    model = DDP(policy", "    policy = model = DDP(policy")
    forward = "            loss, logs = policy.compute_loss(x)"
    assert [f for f in lint_source(rebound.format(forward=forward)) if f.code == "GT013"]
