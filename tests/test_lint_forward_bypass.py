"""GT020: a training loss computed on the module a DDP wrapper holds (issue 33).

Readers of three held-back sets noted the pattern outside the catalogue (set 10: a Fabric
model's ``forward_asr_training`` method; set 13: ``policy.compute_loss`` beside
``DDP(policy)``; set 17: ``model.module.loss_VIB``). The premise is measured here first: on
2 gloo ranks a backward from ``model.module(x)`` leaves each rank its own gradients, while
the wrapper's forward averages them. Every reproduction below is written for this test.
"""

from __future__ import annotations

import textwrap

import torch

from dist_harness import run_ranks
from gpu_training.diagnostics.lint import lint_source


def _gradients_equal_across_ranks(how: str) -> bool:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpu_training.ddp import cleanup_distributed, init_distributed

    ctx = init_distributed()
    try:
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1)
        model = DDP(net)
        x = torch.full((2, 4), float(ctx.rank + 1))  # each rank its own data
        out = model(x) if how == "wrapper" else model.module(x)
        out.sum().backward()
        grads = [torch.zeros_like(net.weight.grad) for _ in range(ctx.world_size)]
        dist.all_gather(grads, net.weight.grad)
        del model, out  # a live DDP model's reducer holds the group (cleanup_distributed)
        return all(torch.equal(grads[0], g) for g in grads)
    finally:
        cleanup_distributed()


def test_the_premise_a_backward_past_the_wrapper_is_not_all_reduced() -> None:
    """Before the rule: what the bug does on real ranks (no error, diverged gradients)."""
    assert run_ranks(_gradients_equal_across_ranks, 2, args=("wrapper",), timeout=90) == [True] * 2
    assert run_ranks(_gradients_equal_across_ranks, 2, args=("module",), timeout=90) == [False] * 2


def _codes(source: str, head: str = "") -> list[tuple[int, str]]:
    return [(f.line, f.code) for f in lint_source(head + textwrap.dedent(source))]


_HEAD = """
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
"""


def test_loss_from_a_module_method_in_a_class_trainer() -> None:
    """The wrapper kept on ``self``, the loss from ``self.model.module.compute_loss``."""
    source = """
    class Trainer:
        def __init__(self, net, local_rank):
            dist.init_process_group("nccl")
            torch.cuda.set_device(local_rank)
            self.model = DDP(net.cuda(), device_ids=[local_rank])

        def train_step(self, batch, optimizer):
            total, parts = self.model.module.compute_loss(batch)
            optimizer.zero_grad()
            total.backward()
            optimizer.step()
    """
    assert (14, "GT020") in _codes(source, _HEAD)


def test_loss_through_several_names_and_a_scaler() -> None:
    source = """
    def main(net, loader, opt):
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        ddp_net = DDP(net.cuda())
        scaler = torch.amp.GradScaler()
        for x, y in loader:
            with torch.autocast("cuda"):
                feats = ddp_net.module.encoder(x)
                logits = ddp_net.module.head(feats)
                loss = torch.nn.functional.cross_entropy(logits, y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        dist.destroy_process_group()
    """
    found = _codes(source, _HEAD)
    assert (14, "GT020") in found and (15, "GT020") in found


def test_not_reported_where_the_wrapper_runs_or_no_gradient_flows() -> None:
    """A side loss beside the wrapper's forward, an evaluation under no_grad, a save, an
    FSDP model's module, a model that is not wrapped."""
    source = """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def main(net, loader, opt, other):
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        model = DDP(net.cuda())
        sharded = FSDP(other.cuda())
        for x, y in loader:
            loss = model(x).sum() + model.module.penalty()
            loss.backward()
            with torch.no_grad():
                teacher = model.module(x)
            distill = (sharded(x) - teacher).pow(2).mean()
            distill.backward()
            plain = other.module_like(x).sum()
            plain.backward()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "m.pt")
        dist.destroy_process_group()
    """
    assert [c for c in _codes(source, _HEAD) if c[1] == "GT020"] == []


def test_not_reported_without_a_wrapper_in_sight() -> None:
    """``.module`` of a parameter nobody hands a DDP wrapper: unknown, not reported."""
    source = """
    import torch

    def step(model, x):
        loss = model.module(x).sum()
        loss.backward()
    """
    assert _codes(source) == []


def test_a_warm_up_backward_before_the_wrapper_exists_is_plain() -> None:
    """``loss = policy.compute_loss(x); loss.backward()`` before ``DDP(policy)`` is made: a
    plain backward (set 13's warm-up pass); the same loss after the wrap is the bug, and
    ``loss +=`` follows the name to the binding it adds to."""
    source = """
    def main(policy, data, loader, opt):
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        loss, _ = policy.compute_loss(data)
        loss.backward()
        policy = policy.bfloat16()
        model = DDP(policy, device_ids=[int(os.environ["LOCAL_RANK"])])
        model.train()
        for batch in loader:
            loss = policy.compute_loss(batch)[0]
            loss += 0.0
            loss.backward()
            opt.step()
        dist.destroy_process_group()
    """
    assert [c for c in _codes(source, _HEAD) if c[1] == "GT020"] == [(16, "GT020")]


def test_fabric_step_methods_go_through_the_wrapper() -> None:
    """Fabric routes ``training_step`` (and validation/test/predict) through the strategy's
    forward itself; another method needs ``mark_forward_method`` (set 15 had the first)."""
    source = """
    import lightning as L

    def main(model, loader):
        fabric = L.Fabric(strategy="ddp", devices=2)
        fabric.launch()
        model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for batch in loader:
            fabric.backward(model.training_step(batch))
            fabric.backward(model.contrastive_loss(batch))
            opt.step()
    """
    assert [c for c in _codes(source) if c[1] == "GT020"] == [(10, "GT020")]
